"""Acceptance profiles: a drafter's measured acceptance on one traffic class, as a file.

Acceptance is the drafter's property on the traffic; the cost of drafting and verifying is the
hardware's. A sweep writes one profile per (target, drafter and its revision, traffic class,
vLLM version, temperature) (`specflow.search.profiles` builds it; `python -m specflow profile`
exports it). A drafter entry with `acceptance_profile: <file>` has vLLM's synthetic rejection
sampler accept at the profile's per-position rates (`rejection_sample_method: synthetic`,
`synthetic_acceptance_rates`; each engine gets its first N): the drafter's real compute cost on
new hardware, with the acceptance measured on the user's own traffic. vLLM has no synthetic
acceptance on its CPU engine, so such an entry is refused there before anything starts.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specflow.spec.errors import Problem, Raw
from specflow.spec.schema import DrafterSpec, Spec

KIND: Literal["specflow.acceptance_profile"] = "specflow.acceptance_profile"


class _Profile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Interval(_Profile):
    """A value with its interval (95% unless the profile says otherwise)."""

    value: float
    lo: float
    hi: float


class CurvePoint(_Profile):
    """Acceptance length at one N: measured on its own engine, and predicted from the largest N
    (a chain's first N rates); either may be absent."""

    n: int = Field(ge=1)
    measured: Interval | None = None
    predicted: Interval | None = None


class LengthBin(_Profile):
    """Requests of one prompt-length bin (terciles) at the largest N."""

    prompt_tokens: str
    """The bin, e.g. `<= 96` or `97-180`."""
    requests: int
    acceptance_length: Interval | None


class AcceptanceProfile(_Profile):
    """One drafter's acceptance on one traffic class (the file `profile` exports)."""

    kind: Literal["specflow.acceptance_profile"] = KIND
    version: Literal[1] = 1
    sweep_id: str
    target: str
    """The target's model id or path, with `@revision` when pinned."""
    drafter: str
    """The drafter entry's name (conf/drafter/<name>.yaml)."""
    method: str
    drafter_model: str | None
    """The drafter's checkpoint, with `@revision` when pinned (None: model-free, e.g. n-gram)."""
    traffic_class: str
    workloads: tuple[str, ...]
    temperature: float
    vllm: str
    confidence: float = 0.95
    n_max: int = Field(ge=1)
    """The largest N measured: `rates` are its per-position unconditional acceptance rates."""
    rates: tuple[Interval, ...]
    """Per position i: the share of drafts whose first i + 1 tokens were accepted (vLLM's
    per-position counters over drafts), pooled over the class's windows at N = n_max."""
    curve: tuple[CurvePoint, ...]
    """Acceptance length at N = 1..n_max."""
    model: Literal["chain", "measured per N"]
    """`chain`: every N is predicted from n_max's rates (and the measured N agree); `measured
    per N`: the series is not a chain (`why`), only measured points stand."""
    why: str = ""
    histogram: dict[str, int] = Field(default_factory=dict)
    """Requests at N = n_max by their own acceptance length (bins of 0.5 tokens per step)."""
    by_prompt_length: tuple[LengthBin, ...] = ()
    windows: int
    """Windows behind `rates`."""
    tokens_per_step: Interval | None = None
    """Generated tokens per target step at N = n_max (generated / (generated - accepted), pooled
    over its windows): acceptance length counts only steps that drafted, this counts every step
    (a drafter that finds nothing to propose brings it to 1). None in profiles written before it
    was recorded."""

    def acceptance_length(self, n: int) -> Interval | None:
        """Acceptance length at N = n: measured there, else predicted (a chain), else None."""
        point = next((c for c in self.curve if c.n == n), None)
        return None if point is None else point.measured or point.predicted

    def synthetic_rates(self) -> list[float]:
        """Per-position rates for vLLM's synthetic sampler: non-increasing, as vLLM requires
        (a chain's unconditional rates are; window noise is clipped)."""
        out: list[float] = []
        for band in self.rates:
            out.append(min(max(0.0, min(1.0, band.value)), out[-1] if out else 1.0))
        return [round(r, 4) for r in out]


def speculation_profile(p: AcceptanceProfile, n: int | None = None) -> dict[str, object]:
    """The profile at N = n (default n_max) in the fields planners and simulators read: the
    `speculation_profile.json` shape proposed for NVIDIA's Model Optimizer (marginal and
    conditional per-position acceptance, mean acceptance length, the method and whether the
    length extrapolates over N, the measurement conditions). vLLM's counters give no per-step
    acceptance-length histogram; the per-request one is `per_request_acceptance_length_histogram`.
    """
    n = p.n_max if n is None else n
    if not 1 <= n <= p.n_max:
        raise ValueError(f"N={n} is not measured by this profile (N = 1..{p.n_max})")
    marginal = p.synthetic_rates()[:n]
    conditional = [m / (marginal[i - 1] if i else 1.0) if (marginal[i - 1] if i else 1.0) else 0.0
                   for i, m in enumerate(marginal)]
    al = p.acceptance_length(n)
    return {
        "schema_version": 1, "producer": "specflow", "method": p.method,
        "accept_length_model": "chain_analytic" if p.model == "chain" else "measured_per_k",
        "verification_method": "longest_prefix", "num_speculative_tokens": n,
        "target_model": {"name": p.target}, "draft_checkpoint": {"name": p.drafter_model or
                                                                 p.drafter},
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "mean_accept_length": round(al.value if al else 1 + sum(marginal), 6),
        "mean_accept_length_interval": [al.lo, al.hi] if al else None,
        "per_request_acceptance_length_histogram": dict(p.histogram) if n == p.n_max else None,
        "measurement_conditions": {
            "dataset": p.traffic_class, "workloads": list(p.workloads),
            "temperature": p.temperature, "vllm": p.vllm, "windows": p.windows,
            "confidence": p.confidence, "specflow_sweep": p.sweep_id,
            "measured_at_n": p.n_max},
    }


REFERENCE_KIND: Literal["specflow.reference"] = "specflow.reference"


class ReferencePoint(_Profile):
    """A reference's acceptance length at one N, with its interval where it was published."""

    n: int = Field(ge=1)
    acceptance_length: float = Field(ge=1)
    lo: float | None = None
    hi: float | None = None


class ReferenceCurve(_Profile):
    """A published or earlier acceptance-length curve (e.g. InferenceX's golden curves:
    acceptance length per N), imported by `python -m specflow reference FILE`; `watch` and
    `compare` hold a measurement against it."""

    kind: Literal["specflow.reference"] = REFERENCE_KIND
    version: Literal[1] = 1
    name: str
    source: str = ""
    target: str | None = None
    drafter: str | None = None
    method: str | None = None
    dataset: str | None = None
    points: tuple[ReferencePoint, ...] = Field(min_length=1)

    def at(self, n: int) -> ReferencePoint | None:
        return next((p for p in self.points if p.n == n), None)


_N_KEYS = ("n", "num_speculative_tokens", "k", "draft_length", "spec_tokens")
_AL_KEYS = ("acceptance_length", "al", "mean_acceptance_length", "accept_length", "mal",
            "mean_accept_length")


def _curve_rows(rows: Sequence[dict[str, object]], where: str) -> list[ReferencePoint]:
    out = []
    for i, row in enumerate(rows, 1):
        low = {str(k).strip().lower(): v for k, v in row.items()}
        n = next((low[k] for k in _N_KEYS if k in low), None)
        al = next((low[k] for k in _AL_KEYS if k in low), None)
        if n is None or al is None:
            raise ValueError(f"{where} row {i}: needs an N column ({', '.join(_N_KEYS)}) and an "
                             f"acceptance-length column ({', '.join(_AL_KEYS)}); got "
                             f"{sorted(low)}")
        try:
            point = ReferencePoint(n=int(str(n)), acceptance_length=float(str(al)),
                                   lo=float(str(low["lo"])) if low.get("lo") not in (None, "")
                                   else None,
                                   hi=float(str(low["hi"])) if low.get("hi") not in (None, "")
                                   else None)
        except (ValueError, ValidationError) as exc:
            raise ValueError(f"{where} row {i}: N={n!r}, acceptance length={al!r}: not a whole "
                             f"N >= 1 and a length >= 1 ({str(exc).splitlines()[0]})") from None
        out.append(point)
    return out


def import_curve(path: str | Path, name: str | None = None) -> ReferenceCurve:
    """A reference curve from a file: a reference already (`specflow.reference`), a JSON list
    of rows or an `{N: length}` object, or a CSV with a header; metadata (`name`, `source`,
    `target`, `drafter`, `method`, `dataset`) from a JSON object's keys beside its `points` or
    `curve`. ValueError says what is wrong."""
    p = Path(path).expanduser()
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from exc
    meta: dict[str, object] = {"name": name or p.stem, "source": str(p.name)}
    if p.suffix.lower() == ".csv":
        import csv
        import io

        rows: list[dict[str, object]] = list(csv.DictReader(io.StringIO(text)))
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"not JSON ({exc.msg}, line {exc.lineno}) nor a .csv file") from None
        if isinstance(data, dict) and data.get("kind") == REFERENCE_KIND:
            try:
                return ReferenceCurve.model_validate(data)
            except ValidationError as exc:
                raise ValueError(f"not a reference curve ({exc.errors()[0]['msg']})") from None
        if isinstance(data, dict) and isinstance(data.get("points", data.get("curve")), list):
            meta.update({k: str(v) for k, v in data.items()
                         if k in ("name", "source", "target", "drafter", "method", "dataset")})
            rows = list(data.get("points", data.get("curve")) or [])
        elif isinstance(data, dict):
            rows = [{"n": k, "acceptance_length": v} for k, v in data.items()]
        elif isinstance(data, list):
            rows = data
        else:
            raise ValueError("expected rows of N and acceptance length")
        if not all(isinstance(r, dict) for r in rows):
            raise ValueError("expected rows of N and acceptance length (objects)")
    points = _curve_rows(rows, p.name)
    if not points:
        raise ValueError("no rows")
    if len({q.n for q in points}) != len(points):
        raise ValueError("an N appears twice")
    return ReferenceCurve.model_validate({**meta, "points": sorted(points, key=lambda q: q.n)})


def read(path: str | Path) -> AcceptanceProfile:
    """A profile file, validated; ValueError says what is wrong with it."""
    p = Path(path).expanduser()
    try:
        return AcceptanceProfile.model_validate_json(p.read_bytes())
    except OSError as exc:
        raise ValueError(f"cannot read it: {exc.strerror or exc}") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "the file"
        raise ValueError(f"not an acceptance profile ({exc.error_count()} problems; {where}: "
                         f"{first['msg']})") from exc


def dumps(profile: AcceptanceProfile) -> str:
    return json.dumps(profile.model_dump(mode="json"), indent=2) + "\n"


SYNTHETIC_RATES = "synthetic_acceptance_rates"
SYNTHETIC_LENGTH = "synthetic_acceptance_length"


def check_synthetic(spec: Spec, name: str, d: DrafterSpec, ns: Sequence[int]) -> list[Problem]:
    """vLLM's synthetic rejection sampling (accept at chosen rates with the real compute cost):
    GPU engines only; per-position rates cover the largest N and each engine gets its first N,
    so one emulated drafter is swept across N."""
    extra = d.extra_speculative_config
    at, src = f"drafter.{name}", f"conf/drafter/{name}.yaml"
    key = f"{at}.extra_speculative_config"
    given = [k for k in (SYNTHETIC_RATES, SYNTHETIC_LENGTH) if k in extra]
    if extra.get("rejection_sample_method") != "synthetic":
        return [Problem(f"{key}.{k}", "only read by vLLM with rejection_sample_method: synthetic",
                        extra[k], "rejection_sample_method: synthetic beside it, or no "
                        f"{k}", source=src) for k in given]
    out = []
    if spec.hardware.vendor == "cpu":
        out.append(Problem(f"{key}.rejection_sample_method", "the CPU engine has no synthetic "
                           "acceptance (vLLM 0.32 fails at start: 'Synthetic acceptance not "
                           "supported with CPU sampling')", "synthetic",
                           "standard on hardware=cpu; emulate acceptance on a GPU", source=src))
    if len(given) != 1:
        return [*out, Problem(key, f"synthetic rejection sampling needs exactly one of "
                              f"{SYNTHETIC_RATES}, {SYNTHETIC_LENGTH}", Raw(", ".join(given) or
                                                                         "neither"),
                              f"one of {SYNTHETIC_RATES} (per position) or {SYNTHETIC_LENGTH}",
                              source=src)]
    value, top = extra[given[0]], max(ns, default=0)
    if given[0] == SYNTHETIC_LENGTH:
        low = min(ns, default=0) + 1
        ok = isinstance(value, int | float) and not isinstance(value, bool) and 1 <= value <= low
        return out if ok else [*out, Problem(f"{key}.{SYNTHETIC_LENGTH}", "vLLM needs a mean "
                                             "acceptance length within [1, N+1] of every N "
                                             "swept", value, f"a number in [1, {low}]",
                                             source=src)]
    ok = (isinstance(value, list) and len(value) >= top
          and all(isinstance(r, int | float) and not isinstance(r, bool) and 0 <= r <= 1
                  for r in value)
          and all(a >= b for a, b in zip(value, value[1:], strict=False)))
    return out if ok else [*out, Problem(f"{key}.{SYNTHETIC_RATES}", "per-position unconditional "
                                         "acceptance rates for every position up to the largest "
                                         "N swept (each engine gets its first N)", value,
                                         f"a non-increasing list of at least {top} numbers in "
                                         "[0, 1]", source=src)]


def apply_profile(name: str, d: DrafterSpec) -> tuple[DrafterSpec, list[Problem]]:
    """A drafter entry with `acceptance_profile`: vLLM's synthetic sampler at the profile's
    rates (checked as any synthetic entry, `check_synthetic`: refused on the CPU engine, rates
    for every N swept), or the problems with the profile named at its field."""
    if d.acceptance_profile is None:
        return d, []
    at, src = f"drafter.{name}.acceptance_profile", f"conf/drafter/{name}.yaml"
    clash = sorted({"rejection_sample_method", SYNTHETIC_RATES, SYNTHETIC_LENGTH}
                   & set(d.extra_speculative_config))
    if clash:
        return d, [Problem(at, f"sets the synthetic acceptance itself; "
                               f"extra_speculative_config also sets {', '.join(clash)}",
                           d.acceptance_profile, "one of the two", source=src)]
    try:
        prof = read(d.acceptance_profile)
    except ValueError as exc:
        return d, [Problem(at, str(exc), d.acceptance_profile,
                           "a profile file written by a sweep (`python -m specflow profile`)",
                           source=src)]
    extra = {**d.extra_speculative_config, "rejection_sample_method": "synthetic",
             SYNTHETIC_RATES: prof.synthetic_rates()}
    return d.model_copy(update={"extra_speculative_config": extra}), []
