"""The target half: what every target shares -- the formats kinds pass between them
(``formats.py``), a target's parameters, base and judgement, the one program a model is
lowered from, constant folding, runners, coverage certificates and their gates, the ONNX
graph's certificates, tools in environments of their own.

It names no architecture: a target lowers a program or a graph, whatever model it came
from. What one target does differently lives in its own kind's package.
"""
