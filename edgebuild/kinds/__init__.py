"""The built-in artifact kinds, listed explicitly: nothing is discovered by walking
modules for a name pattern. A new built-in kind is one package here plus one line
below; a kind from another package is an entry point of the group
``edgebuild.kinds`` instead (see ``edgebuild/plugin.py``). The registry
(``edgebuild/core/registry.py``) loads each by name when it is first needed."""

BUILTIN_KINDS = {
    "hf_onnx": "edgebuild.kinds.hf_onnx:HfOnnx",
    "onnx_qdq": "edgebuild.kinds.onnx_qdq:OnnxQdq",
    "qnn_context": "edgebuild.kinds.qnn_context:QnnContext",
    "qwen3_5_tower_qdq": "edgebuild.kinds.qwen3_5_tower_qdq:Qwen3_5TowerQdq",
    "qwen3_5_vision_tower": "edgebuild.kinds.qwen3_5_tower:Qwen3_5VisionTower",
    "siglip_f143": "edgebuild.kinds.siglip_f143:SiglipF143",
    "siglip_f143_onnx": "edgebuild.kinds.siglip_f143_onnx:SiglipF143Onnx",
    "torch_export": "edgebuild.kinds.torch_export:TorchExport",
    "executorch": "edgebuild.kinds.executorch:Executorch",
    "litert": "edgebuild.kinds.litert:Litert",
    "openvino": "edgebuild.kinds.openvino:Openvino",
    "ort_format": "edgebuild.kinds.ort_format:OrtFormat",
}
