"""kadapt on Keras' TensorFlow backend: the accumulating step, its helpers and out-of-memory forms."""
