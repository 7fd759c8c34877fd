"""SigLIP vision encoders: transformers' model as the kinds load it, the F143 encoder as
files, tiny checkpoints."""
