"""Imported by the fork server just after it forks a build of a kind that exports ONNX
graphs (those kinds' ``build_warmups``): importing it warms torch's exporter up
(:func:`edgebuild.ml.onnx_tools.warm_up_exporter`), so that the builds forked later
export without paying for a first export. A build forked before it does its own."""

from edgebuild.ml.onnx_tools import warm_up_exporter

warm_up_exporter()
