"""Test models written the way real model code is: config objects, KV caches, optimizers."""
