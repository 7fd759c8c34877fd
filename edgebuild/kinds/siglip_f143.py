"""Kind ``siglip_f143``: a SigLIP vision encoder reconstructed onto the F143 grid.

The encoder's linear weights (q, k, v, out_proj, fc1, fc2 of each selected
layer) are quantized to F143 (``torch.float8_e4m3fnuz`` values) times one
power-of-two scale per 64x64 tile, by GPTQ over block-diagonal Hessians or by
nearest rounding; optionally with LayerNorm equalization, sequential layers and
bias correction. The numerics are ``edgebuild.f143`` / ``edgebuild.gptq``
(pure functions, identical to the seed's algorithm); this module is the
orchestration: loading, calibration, hooks, saving, verification.

Where it departs from the seed's script, and why:

- Forward passes. The seed runs the calibration set through the whole model
  four times (references, equalization metrics, Hessians, final metrics) and,
  with ``sequential_layers``, once more per layer. Here the reference pass also
  collects the Hessians (or, with equalization, the second moments), the
  equalization-metrics pass also collects the Hessians, and sequential layers
  run one layer at a time on cached hidden states. The activations are the
  same tensors through the same kernels, so the weights are identical.
- Outputs. ``preprocessor_config.json`` is written (the seed drops it) so the
  directory works as a model directory; the state dict has SiglipVisionModel's
  own keys (no ``vision_model.`` prefix) so it loads strictly into it; a
  negative zero weight is stored as +0.0 (equal in value; float8 has no -0, and
  the packed form must round-trip bit for bit).
- Options the seed lacks, default off for parity: an identity candidate for
  equalization (the seed's best alpha can be worse than not scaling), sorted
  SafeTensors metadata (the seed's header order varies run to run).
"""

from __future__ import annotations

import json
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Literal

from pydantic import Field, field_validator, model_validator

from ..errors import CheckpointError, ParameterError
from ..inputs import expand_inputs
from ..report import Check
from . import register
from .base import ArtifactKind, ArtifactParams, BuildContext, Strict, TensorSelection, Verification, VerifyContext

if TYPE_CHECKING:
    import torch

    from ..checkpoint import Checkpoint

VISION_PREFIX = "vision_model."
LINEAR_SUFFIXES = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.out_proj",
    "mlp.fc1",
    "mlp.fc2",
)
MODEL_FILE = "model.safetensors"
PACKED_FILE = "model.f143.safetensors"
REPORT_FILE = "quantization.json"
EXPONENT_SUFFIX = ".f143_exponent"
PACKED_FORMAT = "edgebuild-f143-v1"


class InputSet(Strict):
    """Calibration or held-out inputs: SafeTensors files with a ``pixel_values``
    tensor and/or images (paths or globs, relative to the manifest)."""

    pixel_values: list[str] = Field(default_factory=list)
    images: list[str] = Field(default_factory=list)

    def is_empty(self) -> bool:
        return not self.pixel_values and not self.images


class SiglipVerify(Strict):
    """Thresholds on the quantized encoder's ``last_hidden_state`` vs the float one."""

    cosine_min: float = Field(default=0.99, ge=-1.0, le=1.0)
    mean_abs: float | None = Field(default=None, ge=0.0)
    max_abs: float | None = Field(default=None, ge=0.0)


class SiglipF143Params(ArtifactParams):
    kind: Literal["siglip_f143"]
    checkpoint: str
    calibration: InputSet
    held_out: InputSet = Field(default_factory=InputSet)
    algorithm: Literal["gptq", "nearest"] = "gptq"
    block_size: int = Field(default=64, gt=0)
    damp: float = Field(default=0.01, ge=0.0)
    bias_correction: bool = True
    sequential_layers: bool = False
    equalize_layernorm: bool = False
    equalization_scale_limit: float = Field(default=16.0, ge=1.0)
    equalization_identity_candidate: bool = Field(
        default=False, description="Also consider no scaling (the seed does not)."
    )
    layers: int | Literal["all"] = "all"
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    sorted_metadata: bool = Field(default=False, description="Deterministic SafeTensors header (the seed's varies).")
    verify: SiglipVerify = Field(default_factory=SiglipVerify)

    @field_validator("layers")
    @classmethod
    def _positive_layers(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError("layers must be at least 1 (or 'all')")
        return value

    @model_validator(mode="after")
    def _has_calibration(self) -> "SiglipF143Params":
        if self.calibration.is_empty():
            raise ValueError("calibration needs at least one pixel_values file or image")
        return self

    def input_files(self) -> list[str]:
        return [
            *self.calibration.pixel_values,
            *self.calibration.images,
            *self.held_out.pixel_values,
            *self.held_out.images,
        ]


@contextmanager
def quiet_transformers() -> Iterator[None]:
    """Silence transformers' advisory warnings for one call: that the fast image
    processor wants torchvision (the PIL one it falls back to is transformers' own),
    and SiglipConfig's remarks about the text tower's token ids (never used here)."""
    from transformers.utils import logging

    previous = logging.get_verbosity()
    logging.set_verbosity_error()
    try:
        yield
    finally:
        logging.set_verbosity(previous)


def load_pixel_batches(inputs: InputSet, root: Path, checkpoint: "Checkpoint", what: str) -> list["torch.Tensor"]:
    """One batch per SafeTensors file, plus one batch of all images through the
    checkpoint's own image processor (the seed's layout)."""
    from safetensors import safe_open

    batches = []
    for path in expand_inputs(inputs.pixel_values, root, f"{what}.pixel_values"):
        with safe_open(str(path), framework="pt", device="cpu") as source:
            if "pixel_values" not in source.keys():
                raise CheckpointError(f"{path}: no 'pixel_values' tensor (found {', '.join(source.keys()) or 'none'})")
            batches.append(source.get_tensor("pixel_values").float())
    images = expand_inputs(inputs.images, root, f"{what}.images")
    if images:
        from PIL import Image
        from transformers import AutoImageProcessor

        with quiet_transformers():
            processor = AutoImageProcessor.from_pretrained(str(checkpoint.directory), local_files_only=True)
        loaded = []
        for path in images:
            with Image.open(path) as image:
                loaded.append(image.convert("RGB"))
        batches.append(processor(images=loaded, return_tensors="pt")["pixel_values"].float())
    return batches


def load_vision_model(checkpoint: "Checkpoint", writable: bool = False) -> tuple[Any, Any]:
    """transformers' ``SiglipVisionModel`` with exactly the checkpoint's ``vision_model.*`` tensors.

    ``writable=True`` for a model whose weights will be rewritten: they get memory
    of their own instead of a view of the file (see ``Checkpoint.load``).
    """
    from transformers import SiglipConfig, SiglipVisionModel
    from transformers.initialization import no_init_weights

    try:
        with quiet_transformers():
            config = SiglipConfig(**checkpoint.config)
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{checkpoint.config_path}: not a SiglipConfig ({error})") from None
    entries = checkpoint.select((VISION_PREFIX,))
    with no_init_weights():
        model = SiglipVisionModel(config.vision_config)
    parameters = dict(model.named_parameters())
    # Assign the loaded tensors instead of copying them into the model's: its own
    # (uninitialised, so never touched) are dropped, and the weights are in memory
    # once.
    state = {
        name: tensor.to(parameters[name].dtype) if name in parameters else tensor
        for name, tensor in checkpoint.load(entries, strip_prefix=VISION_PREFIX, owned=writable).items()
    }
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise CheckpointError(
            f"{checkpoint.label}: the vision_model.* tensors do not match SiglipVisionModel: "
            f"missing {sorted(missing)[:5]}; unexpected {sorted(unexpected)[:5]}"
        )
    return model.eval(), config


def encoder_linears(model: Any, layer_count: int) -> dict[str, Any]:
    """The quantized linears, in module order: ``encoder.layers.{i}.{suffix}`` for i < layer_count."""
    import torch

    selected = {}
    for name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and name.startswith("encoder.layers.") and name.endswith(LINEAR_SUFFIXES):
            if int(name.split(".")[2]) < layer_count:
                selected[name] = module
    return selected


def output_metrics(reference: "torch.Tensor", actual: "torch.Tensor") -> dict[str, float]:
    """The seed's metrics: mean / max abs error, cosine per sample (flattened) averaged."""
    import torch

    error = (actual - reference).abs()
    cosine = torch.nn.functional.cosine_similarity(
        actual.reshape(actual.shape[0], -1), reference.reshape(reference.shape[0], -1)
    ).mean()
    return {
        "mean_absolute_error": error.mean().item(),
        "maximum_absolute_error": error.max().item(),
        "cosine_similarity": cosine.item(),
    }


def summarise(metrics: list[dict[str, float]]) -> dict[str, float]:
    """Worst case over batches (mean error averaged)."""
    if not metrics:
        return {}
    return {
        "mean_absolute_error": sum(item["mean_absolute_error"] for item in metrics) / len(metrics),
        "maximum_absolute_error": max(item["maximum_absolute_error"] for item in metrics),
        "cosine_similarity": min(item["cosine_similarity"] for item in metrics),
    }


def outputs_digest(outputs: list["torch.Tensor"]) -> str:
    from ..fingerprint import digest_bytes

    return digest_bytes(b"".join(output.detach().float().contiguous().numpy().tobytes() for output in outputs))


def _forward(model: Any, batches: list["torch.Tensor"], device: Any) -> list["torch.Tensor"]:
    import torch

    with torch.inference_mode():
        return [model(pixel_values=pixels.to(device), interpolate_pos_encoding=False).last_hidden_state.clone() for pixels in batches]


class _Collector:
    """Forward pre-hooks that accumulate block Hessians and/or second moments."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.hessians: dict[str, Any] = {}
        self.moments: dict[str, list[Any]] = {}
        self._hooks: list[Any] = []

    def hessians_of(self, modules: dict[str, Any]) -> "_Collector":
        from ..gptq import accumulate_block_hessians, empty_block_hessians

        for name, module in modules.items():
            self.hessians[name] = empty_block_hessians(module.in_features, self.block_size, module.weight.device)

            def hook(_module: Any, inputs: tuple[Any, ...], name: str = name) -> None:
                values = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
                self.hessians[name] = accumulate_block_hessians(self.hessians[name], values)

            self._hooks.append(module.register_forward_pre_hook(hook))
        return self

    def moments_of(self, modules: dict[str, Any]) -> "_Collector":
        import torch

        for name, module in modules.items():
            self.moments[name] = [torch.zeros(module.in_features, device=module.weight.device), 0]

            def hook(_module: Any, inputs: tuple[Any, ...], name: str = name) -> None:
                values = inputs[0].detach().float().reshape(-1, inputs[0].shape[-1])
                self.moments[name][0].add_(values.square().sum(dim=0))
                self.moments[name][1] += values.shape[0]

            self._hooks.append(module.register_forward_pre_hook(hook))
        return self

    def close(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()


def _layernorm_groups(model: Any, layer_count: int) -> list[tuple[str, Any, list[Any]]]:
    groups = []
    for index, layer in enumerate(model.encoder.layers[:layer_count]):
        attention = layer.self_attn
        groups.append((f"encoder_layer_{index:02}.norm1_qkv", layer.layer_norm1, [attention.q_proj, attention.k_proj, attention.v_proj]))
        groups.append((f"encoder_layer_{index:02}.norm2_fc1", layer.layer_norm2, [layer.mlp.fc1]))
    return groups


def _pack_state(state: dict[str, "torch.Tensor"], quantized: list[str], block_size: int) -> dict[str, "torch.Tensor"]:
    from ..f143 import pack

    packed = {}
    for name, tensor in state.items():
        if name in quantized:
            codes, exponents = pack(tensor, block_size)
            packed[name] = codes
            packed[name + EXPONENT_SUFFIX] = exponents
        else:
            packed[name] = tensor
    return packed


def load_packed(path: Path) -> dict[str, "torch.Tensor"]:
    """The float state dict back from the packed form, bit for bit equal to ``model.safetensors``."""
    from safetensors import safe_open

    from ..f143 import unpack

    with safe_open(str(path), framework="pt", device="cpu") as source:
        metadata = source.metadata() or {}
        if metadata.get("format_f143") != PACKED_FORMAT:
            raise CheckpointError(f"{path}: not an edgebuild F143 packed file (format_f143={metadata.get('format_f143')!r})")
        block_size = int(metadata["block_size"])
        names = set(source.keys())
        state = {}
        for name in sorted(names):
            if name.endswith(EXPONENT_SUFFIX):
                continue
            tensor = source.get_tensor(name)
            if name + EXPONENT_SUFFIX in names:
                tensor = unpack(tensor, source.get_tensor(name + EXPONENT_SUFFIX), block_size)
            state[name] = tensor
    return state


def _save_safetensors(tensors: dict[str, "torch.Tensor"], path: Path, metadata: dict[str, str], sort: bool) -> None:
    from safetensors.torch import save_file

    save_file({name: value.detach().cpu().contiguous() for name, value in tensors.items()}, str(path), metadata=metadata)
    if sort:
        _sort_metadata(path)


def _sort_metadata(path: Path) -> None:
    """Rewrite the header with sorted keys: same length, so the data offsets hold."""
    import struct

    with open(path, "r+b") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
        metadata = header.pop("__metadata__", None)
        ordered = {"__metadata__": dict(sorted(metadata.items()))} if metadata else {}
        ordered.update(sorted(header.items()))
        encoded = json.dumps(ordered, separators=(",", ":")).encode()
        if len(encoded) > length:
            raise ValueError(f"{path}: sorted header does not fit")
        handle.seek(8)
        handle.write(encoded + b" " * (length - len(encoded)))


@register
class SiglipF143(ArtifactKind):
    name = "siglip_f143"
    summary = "SigLIP vision encoder quantized to F143 (GPTQ) -> SafeTensors"
    Params = SiglipF143Params
    outputs = ("config.json", "preprocessor_config.json", MODEL_FILE, PACKED_FILE, REPORT_FILE)

    def tensor_selection(self, params: ArtifactParams) -> TensorSelection:
        return TensorSelection(prefixes=(VISION_PREFIX,), config_key="vision_config")

    def check_parameters(self, params: ArtifactParams, checkpoints: dict[str, "Checkpoint"]) -> None:
        assert isinstance(params, SiglipF143Params)
        checkpoint = checkpoints[params.checkpoint]
        vision = checkpoint.config_section("vision_config")
        checkpoint.select((VISION_PREFIX,))
        available = vision.get("num_hidden_layers", 12)
        if isinstance(params.layers, int) and params.layers > available:
            raise ParameterError(
                f"{params.layers} is outside the model (vision_config.num_hidden_layers = {available})", key="layers"
            )
        if params.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ParameterError("'cuda' was requested but torch.cuda.is_available() is False", key="device")

    def build(self, context: BuildContext) -> dict[str, Any]:
        import torch

        from .. import gptq

        params = context.params
        assert isinstance(params, SiglipF143Params)
        log = context.log
        checkpoint = context.checkpoint
        timings: dict[str, float] = {}
        device = torch.device(
            ("cuda" if torch.cuda.is_available() else "cpu") if params.device == "auto" else params.device
        )

        started = time.perf_counter()
        model, config = load_vision_model(checkpoint, writable=True)
        model.to(device)
        layer_count = config.vision_config.num_hidden_layers if params.layers == "all" else params.layers
        batches = load_pixel_batches(params.calibration, context.input_root, checkpoint, "calibration")
        held_out = load_pixel_batches(params.held_out, context.input_root, checkpoint, "held_out")
        modules = encoder_linears(model, layer_count)
        timings["load_s"] = time.perf_counter() - started
        log(f"{len(modules)} linears in {layer_count} layers; {sum(len(batch) for batch in batches)} calibration images")

        groups = _layernorm_groups(model, layer_count) if params.equalize_layernorm else []
        collect_now = not params.equalize_layernorm and not params.sequential_layers
        passes = 0

        # Pass 1: the float model's outputs, and whatever statistics its activations give.
        started = time.perf_counter()
        collector = _Collector(params.block_size)
        if collect_now:
            collector.hessians_of(modules)
        if groups:
            collector.moments_of({name: consumers[0] for name, _norm, consumers in groups})
        references = _forward(model, batches, device)
        passes += 1
        collector.close()
        held_out_references = _forward(model, held_out, device)
        timings["reference_pass_s"] = time.perf_counter() - started

        equalization: dict[str, Any] = {}
        equalization_metrics: list[dict[str, float]] = []
        if groups:
            started = time.perf_counter()
            with torch.no_grad():
                for name, norm, consumers in groups:
                    total, count = collector.moments.pop(name)
                    moment = total / count
                    choice = gptq.choose_equalization_scale(
                        [consumer.weight for consumer in consumers],
                        moment,
                        params.block_size,
                        params.equalization_scale_limit,
                        include_identity=params.equalization_identity_candidate,
                    )
                    norm_weight, norm_bias, weights = gptq.fold_scale(
                        norm.weight, norm.bias, [consumer.weight for consumer in consumers], choice.scale
                    )
                    norm.weight.copy_(norm_weight)
                    norm.bias.copy_(norm_bias)
                    for consumer, weight in zip(consumers, weights):
                        consumer.weight.data = weight  # a swap, as in _reconstruct
                    equalization[name] = {
                        "alpha": choice.alpha,
                        "objective_ratio": choice.objective / choice.baseline if choice.baseline else 0.0,
                        "scale_minimum": choice.scale.min().item(),
                        "scale_maximum": choice.scale.max().item(),
                    }
                    log(f"equalized {name}: alpha {choice.alpha}, objective {equalization[name]['objective_ratio']:.4f}x")
            # Pass 2: the equalized model (its metrics), collecting the Hessians on the way.
            collector = _Collector(params.block_size)
            if not params.sequential_layers:
                collector.hessians_of(modules)
            equalized = _forward(model, batches, device)
            passes += 1
            collector.close()
            equalization_metrics = [output_metrics(reference, output) for reference, output in zip(references, equalized)]
            timings["equalization_s"] = time.perf_counter() - started

        started = time.perf_counter()
        objectives: dict[str, dict[str, float]] = {}
        clamped: dict[str, int] = {}
        reconstruction_s = 0.0
        if params.sequential_layers:
            hidden = self._embed(model, batches, device)
            for layer in range(layer_count):
                marker = f"encoder.layers.{layer}."
                layer_modules = {name: module for name, module in modules.items() if name.startswith(marker)}
                collector = _Collector(params.block_size).hessians_of(layer_modules)
                self._run_layer(model, layer, hidden)
                collector.close()
                reconstruction_s += self._reconstruct(layer_modules, collector, params, objectives, clamped, len(modules), log)
                hidden = self._run_layer(model, layer, hidden)
            passes += 1
        else:
            reconstruction_s += self._reconstruct(modules, collector, params, objectives, clamped, len(modules), log)
        timings["reconstruction_s"] = reconstruction_s
        timings["collection_s"] = time.perf_counter() - started - reconstruction_s

        started = time.perf_counter()
        quantized_outputs = _forward(model, batches, device)
        held_out_outputs = _forward(model, held_out, device)
        passes += 1
        metrics = [output_metrics(reference, output) for reference, output in zip(references, quantized_outputs)]
        held_out_metrics = [output_metrics(reference, output) for reference, output in zip(held_out_references, held_out_outputs)]
        timings["final_pass_s"] = time.perf_counter() - started

        started = time.perf_counter()
        state = {name: value.detach().cpu() for name, value in model.state_dict().items()}
        quantized_names = [f"{name}.weight" for name in modules]
        out = context.out_dir
        shutil.copy2(checkpoint.config_path, out / "config.json")
        preprocessor = checkpoint.directory / "preprocessor_config.json"
        if not preprocessor.is_file():
            raise CheckpointError(f"{preprocessor}: missing (SigLIP checkpoints carry their image processor config)")
        shutil.copy2(preprocessor, out / "preprocessor_config.json")
        metadata = {
            "format": "pt",
            "ipu_f143_reconstruction": params.algorithm,
            "edgebuild_fingerprint": context.fingerprint,
        }
        _save_safetensors(state, out / MODEL_FILE, metadata, params.sorted_metadata)
        packed_metadata = {"format": "pt", "format_f143": PACKED_FORMAT, "block_size": str(params.block_size),
                           "edgebuild_fingerprint": context.fingerprint}
        _save_safetensors(_pack_state(state, quantized_names, params.block_size), out / PACKED_FILE, packed_metadata, True)
        timings["save_s"] = time.perf_counter() - started

        report = {
            "algorithm": f"block-diagonal-f143-{params.algorithm}",
            "options": params.build_parameters(),
            "layers": layer_count,
            "quantized_linears": quantized_names,
            "equalization": equalization,
            "equalization_metrics": equalization_metrics,
            "metrics": metrics,
            "held_out_metrics": held_out_metrics,
            "objectives": objectives,
            "objective_ratio": (
                sum(item["reconstructed"] for item in objectives.values()) / sum(item["nearest"] for item in objectives.values())
                if objectives and sum(item["nearest"] for item in objectives.values()) else 0.0
            ),
            "saturated_weights": clamped,
            "calibration_outputs_digest": outputs_digest(quantized_outputs),
            "held_out_outputs_digest": outputs_digest(held_out_outputs),
            "forward_passes": passes,
            "timings": timings,
        }
        (out / REPORT_FILE).write_text(json.dumps(report, indent=2) + "\n")
        log(
            f"objective ratio {report['objective_ratio']:.4f}; cosine {summarise(metrics)['cosine_similarity']:.6f}; "
            f"{passes} calibration passes; reconstruction {reconstruction_s:.2f} s"
        )
        return {"timings": timings, "forward_passes": passes, "objective_ratio": report["objective_ratio"]}

    @staticmethod
    def _embed(model: Any, batches: list[Any], device: Any) -> list[Any]:
        import torch

        with torch.inference_mode():
            return [model.embeddings(pixels.to(device), interpolate_pos_encoding=False) for pixels in batches]

    @staticmethod
    def _run_layer(model: Any, layer: int, hidden: list[Any]) -> list[Any]:
        """One encoder layer on cached inputs, called as ``SiglipEncoder.forward`` calls it."""
        import torch

        with torch.inference_mode():
            return [model.encoder.layers[layer](state, None) for state in hidden]

    @staticmethod
    def _reconstruct(
        modules: dict[str, Any],
        collector: _Collector,
        params: SiglipF143Params,
        objectives: dict[str, dict[str, float]],
        clamped: dict[str, int],
        total: int,
        log: Any,
    ) -> float:
        import torch

        from .. import gptq

        elapsed = 0.0
        with torch.no_grad():
            for name, module in modules.items():
                statistics = collector.hessians.pop(name)
                started = time.perf_counter()
                result = gptq.reconstruct(
                    module.weight.detach(), statistics.hessians, params.damp, params.algorithm, params.block_size
                )
                correction = torch.zeros(module.out_features, device=module.weight.device)
                if params.bias_correction and module.bias is not None:
                    correction = gptq.bias_correction(result.residual, statistics.input_mean)
                    module.bias.add_(correction.to(module.bias.dtype))
                # Swap the storage rather than copy into it: the loaded weight may be a
                # copy-on-write file mapping, where writing costs a page fault per 4 KiB.
                module.weight.data = result.weight
                # float8 has no -0: store +0.0 (in place, before the final pass), so that
                # the packed form round-trips bit for bit and the outputs come from these weights.
                module.weight.add_(0.0)
                elapsed += time.perf_counter() - started
                clamped[name] = result.saturated
                objectives[name] = {
                    "nearest": result.nearest_objective,
                    "reconstructed": result.reconstructed_objective,
                    "ratio": result.reconstructed_objective / result.nearest_objective if result.nearest_objective else 0.0,
                    "bias_correction_rms": correction.square().mean().sqrt().item(),
                }
                log(f"[{len(objectives)}/{total}] reconstructed {name} (weighted error {objectives[name]['ratio']:.4f}x)")
        return elapsed

    def verify(self, context: VerifyContext) -> Verification:
        import torch
        from safetensors import safe_open
        from transformers import SiglipVisionConfig, SiglipVisionModel
        from transformers.initialization import no_init_weights

        from ..f143 import off_grid_count, tile_exponents

        params = context.params
        assert isinstance(params, SiglipF143Params)
        out = context.out_dir
        report = json.loads((out / REPORT_FILE).read_text())
        checkpoint = context.checkpoint
        float_model, config = load_vision_model(checkpoint)
        with no_init_weights():
            # The written config.json, as a user of the directory would read it.
            written = json.loads((out / "config.json").read_text())
            quantized_model = SiglipVisionModel(SiglipVisionConfig(**written["vision_config"]))
        with safe_open(str(out / MODEL_FILE), framework="pt") as source:
            saved = {name: source.get_tensor(name) for name in source.keys()}
            metadata = source.metadata() or {}
        missing, unexpected = quantized_model.load_state_dict(saved, strict=False)
        quantized_model.eval()
        checks = [
            Check.measure("strict_reload", len(missing) + len(unexpected), "==", 0,
                          f"SiglipVisionModel.load_state_dict: missing {missing[:3]}, unexpected {unexpected[:3]}"),
            Check.measure("metadata_algorithm", metadata.get("ipu_f143_reconstruction"), "==", params.algorithm),
        ]

        off_grid = 0
        for name in report["quantized_linears"]:
            off_grid += off_grid_count(saved[name], tile_exponents(saved[name], params.block_size), params.block_size)
        checks.append(Check.measure("off_grid_weights", off_grid, "==", 0,
                                    f"every weight of {len(report['quantized_linears'])} linears / its tile scale is an F143 value"))

        packed = load_packed(out / PACKED_FILE)
        mismatched = [name for name in saved if name not in packed or saved[name].dtype != packed[name].dtype
                      or not torch.equal(saved[name].view(torch.uint8) if saved[name].dtype == torch.float32 else saved[name],
                                         packed[name].view(torch.uint8) if packed[name].dtype == torch.float32 else packed[name])]
        checks.append(Check.measure("packed_round_trip_mismatches", len(mismatched), "==", 0,
                                    "unpacked model.f143.safetensors vs model.safetensors, bit for bit"))
        float_bytes = sum(saved[name].numel() * 4 for name in report["quantized_linears"])
        with safe_open(str(out / PACKED_FILE), framework="pt") as source:
            packed_bytes = sum(
                _nbytes(source, name)
                for name in source.keys()
                if name.removesuffix(EXPONENT_SUFFIX) in report["quantized_linears"]
            )

        device = torch.device("cpu")
        batches = load_pixel_batches(params.calibration, context.input_root, checkpoint, "calibration")
        held_out = load_pixel_batches(params.held_out, context.input_root, checkpoint, "held_out")
        metrics_summary: dict[str, Any] = {}
        for label, inputs, digest_key in (("calibration", batches, "calibration_outputs_digest"),
                                          ("held_out", held_out, "held_out_outputs_digest")):
            if not inputs:
                continue
            references = _forward(float_model, inputs, device)
            outputs = _forward(quantized_model, inputs, device)
            summary = summarise([output_metrics(reference, output) for reference, output in zip(references, outputs)])
            metrics_summary[label] = summary
            checks.append(Check.measure(f"{label}.cosine", summary["cosine_similarity"], ">=", params.verify.cosine_min,
                                        "quantized vs float SiglipVisionModel last_hidden_state, worst batch"))
            if params.verify.mean_abs is not None:
                checks.append(Check.measure(f"{label}.mean_abs", summary["mean_absolute_error"], "<=", params.verify.mean_abs))
            if params.verify.max_abs is not None:
                checks.append(Check.measure(f"{label}.max_abs", summary["maximum_absolute_error"], "<=", params.verify.max_abs))
            checks.append(Check.measure(f"{label}.reload_reproduces_build", outputs_digest(outputs), "==", report[digest_key],
                                        "digest of the reloaded model's outputs vs the in-memory model's at build time"))
        return Verification(
            checks=checks,
            metrics={
                "outputs": metrics_summary,
                "objective_ratio": report["objective_ratio"],
                "packed_weight_bytes": packed_bytes,
                "float32_weight_bytes": float_bytes,
                "packed_ratio": packed_bytes / float_bytes if float_bytes else 0.0,
                "saturated_weights": sum(report["saturated_weights"].values()),
            },
        )


def _nbytes(source: Any, name: str) -> int:
    sizes = {"F8_E4M3FNUZ": 1, "I8": 1, "F32": 4, "BF16": 2, "F16": 2}
    tensor_slice = source.get_slice(name)
    count = 1
    for dimension in tensor_slice.get_shape():
        count *= dimension
    return count * sizes[tensor_slice.get_dtype()]
