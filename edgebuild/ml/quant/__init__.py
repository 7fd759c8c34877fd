"""The numerics of the F143 grid and GPTQ: pure functions, identical to the seed's algorithm."""
