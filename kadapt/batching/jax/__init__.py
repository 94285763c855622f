"""kadapt on Keras' JAX backend: the accumulating step, its out-of-memory forms and memory plan."""
