"""The numerics: F143 projection, tile scales and packing (``f143``), block GPTQ,
bias correction and equalization (``gptq``), and their fused CPU kernels
(``kernels``). Pure functions: no files, no globals, no orchestration."""
