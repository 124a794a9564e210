"""GuardReport text and accessors."""
from __future__ import annotations

from simaccel.guards import DroppedGuard, GuardReport, KeptGuard, LiftedScalar
from simaccel.guards.report import ARRIVES_AS_GUARD_ONLY, ARRIVES_AS_TENSOR


def test_report_text_lists_every_section() -> None:
    report = GuardReport(
        policy="auto",
        lifted=(
            LiftedScalar("L['alpha']", "float", "argument", 0.5, ARRIVES_AS_TENSOR,
                         "l_alpha_", 1),
            LiftedScalar("L['beta']", "float", "argument", 2.0, ARRIVES_AS_GUARD_ONLY,
                         guards=("L['beta'] > 0.0",)),
        ),
        dropped=(DroppedGuard("L['alpha']", "CONSTANT_MATCH: L['alpha'] == 0.5",
                              "TYPE_MATCH: type(L['alpha']) is float"),),
        kept=(KeptGuard("L['flag']", "CONSTANT_MATCH: L['flag'] == True",
                        "bool: steers control flow"),),
        retraced=True,
    )
    text = str(report)
    assert "guard report (lift=auto, re-traced)" in text
    assert "L['alpha']: float argument = 0.5 -> float64 0-d tensor, placeholder l_alpha_" in text
    assert "guarded by L['beta'] > 0.0" in text
    assert "CONSTANT_MATCH: L['alpha'] == 0.5  ->  TYPE_MATCH: type(L['alpha']) is float" in text
    assert "CONSTANT_MATCH: L['flag'] == True  (bool: steers control flow)" in text
    assert "warnings: none" in text
    assert report.lifted_sources == ("L['alpha']", "L['beta']")
    assert report.kept_sources == ("L['flag']",)


def test_empty_report() -> None:
    text = str(GuardReport(policy="off"))
    assert "no re-trace" in text and "lifted scalars: none" in text
