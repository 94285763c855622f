"""Model builders."""

from kadapt.models.small_cnn import small_cnn
