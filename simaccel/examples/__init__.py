"""Complete programs built on simaccel, shared by the CLI, the bench and the tests:
:mod:`.ddp_train` (data-parallel training runs) and :mod:`.ddp_demo` (``simaccel demo
--ddp``)."""
