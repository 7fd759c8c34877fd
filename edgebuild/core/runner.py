"""Running an artifact, or the float model it was made from, on inputs: what the engine
needs from a kind to judge an artifact along its chain and on data.

A kind's verify module may define, beside ``verify(context)``, any of these functions
(each optional; the engine looks them up by name, so they are in the kind's
verification fingerprint like the rest of the module)::

    runner(context) -> Runner | None           # the built artifact, run here (default: onnxruntime's
                                               # CPU provider on model.onnx, for a kind that writes one)
    float_model(context) -> Runner             # a kind that starts a chain: the float model it was made
                                               # from (transformers' own forward), the reference of the
                                               # whole chain
    evaluation_inputs(context) -> Inputs | None  # the real inputs its verification runs on (held-out
                                               # images), which the artifacts made from it reuse
    image_feeds(context, images) -> list[Feed] # how images (PIL, RGB) become its inputs, through the
                                               # checkpoint's own image processor
    float_limits(params, output) -> OutputLimits  # default limits on an output against the float model

A :class:`Runner` takes feeds (input name -> NumPy array, one dict per run of the
fixed-shape graph) and returns outputs (output name -> array) for each.

:func:`random_feeds` is the one rule for seeded random inputs: every kind, target and
the chain's judgement draws them from it, so that the same seed is the same inputs
wherever an artifact is run (and a user can draw them again: ``docs/concepts/verification.md``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal

if TYPE_CHECKING:
    import numpy

Feed = dict[str, "numpy.ndarray"]
Outputs = dict[str, "numpy.ndarray"]

# The optional functions of a verify module, by name (see the module docstring).
HOOKS = ("runner", "float_model", "evaluation_inputs", "image_feeds", "float_limits")


@dataclass(frozen=True)
class TensorSpec:
    """One input or output: its name, fixed shape (``None`` for a dimension the runner
    does not fix) and NumPy dtype name."""

    name: str
    shape: tuple[int | None, ...]
    dtype: str

    def fits(self, array: Any) -> bool:
        """Whether ``array`` has this shape (where fixed) and dtype."""
        return (str(array.dtype) == self.dtype and len(array.shape) == len(self.shape)
                and all(expected is None or expected == found for expected, found in zip(self.shape, array.shape)))

    def describe(self) -> str:
        dims = ", ".join("?" if dim is None else str(dim) for dim in self.shape)
        return f"{self.name} [{dims}] {self.dtype}"


@dataclass
class Runner:
    """Something that runs here on feeds: ``run_one(feed) -> outputs``. ``description``
    says what ran (the runtime, its version, the provider) in reports; ``inputs`` and
    ``outputs`` declare the signature feeds must fit. ``simulated``: a simulator of the
    device (its time says nothing of the device's: latency is recorded, never gated);
    ``threads``: the threads it runs on, when it says; ``on_threads``: the same model on
    a fixed number of threads (a new runner, closed by its caller), where the runtime
    lets that be fixed: what latency is timed on (``edgebuild/run/latency.py``);
    ``module_outputs``: for one feed, the tensor at the end of each module of the model
    that the runtime shows, by module path, in the order they end (``edgebuild/ml/taps.py``;
    what ``doit divergence`` compares), ``None`` where the runtime shows none."""

    description: str
    inputs: list[TensorSpec]
    outputs: list[str]
    run_one: Callable[[Feed], Outputs]
    close: Callable[[], None] = field(default=lambda: None)
    simulated: bool = False
    threads: int | None = None
    on_threads: "Callable[[int], Runner] | None" = None
    module_outputs: "Callable[[Feed], dict[str, numpy.ndarray]] | None" = None

    def run(self, feeds: list[Feed]) -> list[Outputs]:
        return [self.run_one(feed) for feed in feeds]

    def misfit(self, feed: Feed) -> str | None:
        """Why ``feed`` does not fit the inputs, or ``None`` when it does."""
        expected = {spec.name: spec for spec in self.inputs}
        if set(feed) != set(expected):
            return f"it gives {', '.join(sorted(feed)) or 'nothing'}, and the inputs are {', '.join(sorted(expected))}"
        for name, spec in expected.items():
            if not spec.fits(feed[name]):
                return f"{name} is [{', '.join(map(str, feed[name].shape))}] {feed[name].dtype}, expected {spec.describe()}"
        return None


@dataclass
class Inputs:
    """Inputs of an evaluation: the feeds, what they are (for reports) and, for a
    labelled set, one integer label per feed."""

    feeds: list[Feed]
    description: str
    labels: list[int] | None = None


def random_feeds(specs: Sequence[TensorSpec], count: int, seed: "int | numpy.random.Generator",
                 vocabulary: int | None = None, floats: Literal["normal", "uniform"] = "normal") -> list[Feed]:
    """``count`` seeded feeds for ``specs``, from NumPy's default generator (``seed``, or a
    generator to go on drawing from): floating inputs from N(0, 1) (``floats="uniform"``:
    uniform in [-1, 1], about the range of normalised pixels); token ids (``*_ids``, but
    token type ids) uniform below ``vocabulary`` when it is known, else zero; booleans and
    masks (``*_mask``) all true, all ones -- an all-zero attention mask would attend to
    nothing; other integers zero. A dimension the spec leaves open is 1."""
    import numpy

    generator = seed if isinstance(seed, numpy.random.Generator) else numpy.random.default_rng(seed)
    feeds = []
    for _ in range(count):
        feed = {}
        for spec in specs:
            shape = tuple(1 if dim is None else dim for dim in spec.shape)
            if spec.dtype.startswith("float"):
                values = generator.standard_normal(shape) if floats == "normal" else generator.uniform(-1.0, 1.0, shape)
                feed[spec.name] = values.astype(spec.dtype)
            elif spec.dtype == "bool" or spec.name.endswith("_mask"):
                feed[spec.name] = numpy.ones(shape, dtype=spec.dtype)
            elif vocabulary and spec.name.endswith("_ids") and "token_type" not in spec.name:
                feed[spec.name] = generator.integers(0, vocabulary, shape).astype(spec.dtype)
            else:
                feed[spec.name] = numpy.zeros(shape, dtype=spec.dtype)
        feeds.append(feed)
    return feeds


def with_held_out(inputs: Inputs, held: Inputs | None, specs: Sequence[TensorSpec]) -> Inputs:
    """``inputs`` and those of ``held`` (the held-out inputs along a chain:
    ``VerifyContext.held_out``) that fit ``specs``: judged on data where the manifest
    declares some, not on noise alone."""
    if held is None:
        return inputs
    names = {spec.name for spec in specs}
    fitting = [feed for feed in held.feeds if set(feed) == names and all(spec.fits(feed[spec.name]) for spec in specs)]
    if not fitting:
        return inputs
    return Inputs(inputs.feeds + fitting, f"{held.description} and {inputs.description}", inputs.labels)
