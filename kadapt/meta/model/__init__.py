"""The meta-model: what it reads (features), what it chooses between (actions), its records' form, its file.

`meta_model` holds the file (the spec it carries, save and load, scoring);
`hyper_model` and `ensemble` build it for a search and pack several into one;
`numpy_forward` runs it inside `fit`; `pretrained/` is the shipped default.
"""
