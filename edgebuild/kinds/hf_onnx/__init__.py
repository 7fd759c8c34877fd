"""Kind ``hf_onnx``: any transformers model class, exported at fixed input shapes as one ONNX graph.

No code per architecture: the class is named in the manifest (``CLIPVisionModel``,
``Dinov2Model``, ``Wav2Vec2Model``, ``SiglipVisionModel``, ...) and loaded with its own
``from_pretrained`` from the checkpoint directory, strictly (a missing tensor is an
error, not a freshly initialised weight). ``build.py`` exports it with torch's dynamo
exporter at the manifest's input shapes and clears ``allowzero`` on every Reshape;
``verify.py`` compares onnxruntime's outputs with the model's own forward.

The fingerprint covers all of ``config.json`` and every tensor of the checkpoint (what
``from_pretrained`` may read), or only those under ``tensor_prefixes`` -- and then the
build refuses a class that reads one outside them.
"""

from __future__ import annotations

from edgebuild.ml.onnx_tools import EXPORT_IMPORTS, EXPORT_WARMUPS
from edgebuild.models.hf import TRANSFORMERS_IMPORTS
from edgebuild.models.hf_fixtures import FIXTURES
from edgebuild.models.inputs import read_tokenizer_files
from edgebuild.models.sample_images import starter_samples
from edgebuild.plugin import ArtifactKind, Checkpoint, ParameterError, Process, Starter, TensorSelection
from edgebuild.targets.formats import EXPORTED_GRAPH, ONNX_GRAPH

from .params import INFO_FILE, MODEL_FILE, WEIGHTS_FILE, HfOnnxParams

PREPROCESSOR_FILE = "preprocessor_config.json"


class HfOnnx(ArtifactKind[HfOnnxParams]):
    name = "hf_onnx"
    summary = "any transformers model class -> fixed-shape ONNX"
    Params = HfOnnxParams
    outputs = (MODEL_FILE, WEIGHTS_FILE, INFO_FILE)
    produces = (ONNX_GRAPH, EXPORTED_GRAPH)
    step = "export"
    coverage_targets = ("nnapi", "coreml", "directml")
    build_module = "edgebuild.kinds.hf_onnx.build"
    verify_module = "edgebuild.kinds.hf_onnx.verify"
    # Like the tower: an export and onnxruntime sessions beside the model.
    process = Process(memory_factor=3.0, worker_imports=TRANSFORMERS_IMPORTS + EXPORT_IMPORTS,
                      build_warmups=EXPORT_WARMUPS)
    fixtures = FIXTURES
    starter = Starter(
        checkpoints={"clip": "clip_vision_tiny"},
        entry="""\
  # Any transformers model class as one fixed-shape ONNX graph, checked against the
  # model's own forward: here a CLIP vision encoder at 64x64.
  clip_64:
    kind: hf_onnx
    description: CLIP vision encoder, one 64x64 image, float32
    checkpoint: clip
    model_class: CLIPVisionModel
    inputs: {pixel_values: [1, 3, 64, 64]}     # name: shape (or {shape, dtype})
    outputs: [pooler_output]
    held_out:
      images: [data/held_out/*.png]      # through the checkpoint's image processor
""",
        samples=starter_samples(),
    )

    def tensor_selection(self, params: HfOnnxParams, checkpoint: Checkpoint) -> TensorSelection:
        prefixes = tuple(params.tensor_prefixes) if params.tensor_prefixes is not None else ("",)
        # Held-out images go through the checkpoint's own image processor, texts through its
        # tokenizer; a text model's tokenizer goes to its consumers (consumer.json).
        files = ((PREPROCESSOR_FILE,) if params.held_out.images else ()) + read_tokenizer_files(params, checkpoint)
        return TensorSelection(prefixes=prefixes, config_key=None, files=files)

    def check_deeply(self, params: HfOnnxParams, checkpoints: dict[str, Checkpoint]) -> None:
        from edgebuild.models.hf import check_forward_inputs

        check_forward_inputs(params.model_class, params.inputs)

    def check_parameters(self, params: HfOnnxParams, checkpoints: dict[str, Checkpoint]) -> None:
        checkpoint = checkpoints[params.checkpoint]
        architectures = checkpoint.config.get("architectures")
        if isinstance(architectures, list) and params.model_class in architectures:
            return
        # Not the checkpoint's own class (a vision encoder of a two-tower checkpoint): it
        # must at least be one of transformers'. Only here is transformers imported.
        from edgebuild.errors import ExportError
        from edgebuild.models.hf import transformers_class

        try:
            transformers_class(params.model_class, "model_class")
        except ExportError as error:
            raise ParameterError(str(error).removeprefix("model_class: "), key="model_class") from None
