"""kadapt's JAX backend: the accumulating step, its memory plan and out-of-memory forms."""
