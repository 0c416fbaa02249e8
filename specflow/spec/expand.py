"""Workloads as the sweep sees them: a trace split into one workload per class, and each service
compiled into a workload that mixes its classes' requests in their shares.

Run once after validation (`specflow.config.compose.load`), so that every later step (the plan
and its hash, headroom, materialising, the decision) sees plain workloads with a class each.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from specflow.spec.errors import Problem, Raw, SpecError, did_you_mean, one_of
from specflow.spec.schema import (
    CAPACITY_POINT,
    ArrivalSpec,
    MixSource,
    ServiceSpec,
    Spec,
    TraceSource,
    WorkloadSpec,
)
from specflow.spec.traces import Trace, file_sha256, read_trace

SHARE_DIGITS = 6
"""Shares are rounded to this many digits (so that the plan's hash is stable)."""


def expand(spec: Spec) -> Spec:
    """`spec` with split traces and services as workloads; SpecError lists every problem."""
    problems: list[Problem] = []
    workloads: dict[str, WorkloadSpec] = {}
    trace_share: dict[str, tuple[str, float]] = {}
    split_from: dict[str, list[str]] = {}
    split_of: dict[str, str] = {}  # a split class's workload: the trace workload's name
    read: dict[str, Trace] = {}  # the traces split, by how they are read (`_read_key`): once
    failed: set[str] = set()
    for name, w in spec.workload.items():
        if isinstance(w.source, MixSource):
            problems += _user_mix(name, w.source, spec.workload)
        if not (isinstance(w.source, TraceSource) and w.traffic_class is None):
            workloads[name] = _pinned(w, w.source) if isinstance(w.source, TraceSource) else w
            continue
        split, shares, found = _split(name, w, w.source, spec.workload, read)
        problems += found
        for c in split:
            if c in workloads:  # an earlier trace's class of the same name
                problems.append(Problem(f"workload.{name}.source.class_field", "two traces "
                                        "hold a class of this name", c, "classes with "
                                        "distinct names (source.classes picks classes)"))
        workloads.update(split)
        trace_share.update(shares)
        split_from[name] = list(split)
        split_of.update(dict.fromkeys(split, name))
        if found and not split:
            failed.add(name)
    classes = {w.traffic_class or n for n, w in workloads.items()}
    for sname, svc in spec.service.items():
        if isinstance(svc.classes, list):  # a split trace's name: all of its classes
            if failed & set(svc.classes):
                continue  # the trace's own problems say why
            svc = svc.model_copy(update={"classes": [
                c for n in svc.classes for c in split_from.get(n, [n])]})
        if sname in classes and sname not in workloads:
            problems.append(Problem(f"service.{sname}", "a service has the name of a traffic "
                                    "class (its windows would join that class's decision)",
                                    sname, f"a name no workload or class has: not one of "
                                    f"{sorted(classes)}"))
            continue
        try:
            workloads[sname] = _service(sname, svc, workloads, trace_share)
        except SpecError as err:
            problems += err.problems
    problems += _mixed_arrivals(spec, workloads)
    problems += objective_problems(spec, workloads, split_of)
    if problems:
        raise SpecError(problems)
    workloads, problems = by_rate(workloads, split_of, read)
    if problems:
        raise SpecError(problems)
    if workloads == spec.workload:
        return spec
    return spec.model_copy(update={"workload": workloads})


def rate_name(workload: str, rate: float) -> str:
    """The name of an open-loop workload's point at one offered rate: `code@2rps`."""
    return f"{workload}@{rate:g}rps"


def by_rate(workloads: Mapping[str, WorkloadSpec], split_of: Mapping[str, str] | None = None,
            read: dict[str, Trace] | None = None
            ) -> tuple[dict[str, WorkloadSpec], list[Problem]]:
    """Each open-loop workload as its points, in its place: one per offered rate (`rate_name`,
    or `<name>@<speed>x` for multiples of a trace's own rate) with its rate and burstiness
    stated; its capacity search (`<name>@capacity`, `capacity_from`); and, with `closed_loop`,
    itself closed loop. Closed-loop workloads as they are. `split_of`: a split trace's class
    workloads, by the name of the workload they came from (for problems' paths); `read`: the
    traces already read (`_read_key`; each is read once)."""
    out: dict[str, WorkloadSpec] = {}
    problems: list[Problem] = []
    read = {} if read is None else read
    for name, w in workloads.items():
        a = w.arrival
        if a is None or _point(name, a):
            out[name] = w
            continue
        if a.closed_loop:
            out[name] = w.model_copy(update={"arrival": None})
        shape = a.burstiness or 1.0
        points = [(rate_name(name, r), r) for r in dict.fromkeys(a.request_rate)]
        if a.trace_speed:
            where = f"workload.{(split_of or {}).get(name, name)}.arrival.trace_speed"
            fitted = _trace_arrival(where, w, read)
            if isinstance(fitted, Problem):
                problems.append(fitted)
                continue
            rate, shape = fitted[0], a.burstiness or fitted[1]
            points = [(f"{name}@{s:g}x", round(rate * s, SHARE_DIGITS))
                      for s in dict.fromkeys(a.trace_speed)]
        for point, r in points:
            out[point] = w.model_copy(update={"arrival": ArrivalSpec(
                request_rate=[r], burstiness=shape)})
        if a.capacity_from is not None:
            out[name + CAPACITY_POINT] = w.model_copy(update={"arrival": ArrivalSpec(
                capacity_from=a.capacity_from, burstiness=shape)})
    return out, problems


def _point(name: str, a: ArrivalSpec) -> bool:
    """An arrival already one point's (expanded by `by_rate`)."""
    return "@" in name and a.burstiness is not None and not a.closed_loop and \
        len(a.request_rate) + (a.capacity_from is not None) == 1 and not a.trace_speed


def _trace_arrival(where: str, w: WorkloadSpec, read: dict[str, Trace]
                   ) -> tuple[float, float] | Problem:
    """A trace workload's own arrival: its requests' rate over the span of their timestamps
    and the gamma shape of their gaps (1 / CV^2, Poisson's is 1), or why there is none."""
    src = w.source
    if not isinstance(src, TraceSource):
        return Problem(where, "multiples of a trace's own rate need a trace source",
                       Raw(src.kind), "request_rate: [req/s, ...]")
    key = _read_key(src)
    trace = read.get(key) or read.setdefault(key, read_trace(src.path, src))
    times = sorted(r.timestamp for r in trace.requests if r.timestamp is not None
                   and (src.classes is None or r.traffic_class in src.classes))
    gaps = np.diff(times)
    if len(times) < 3 or not gaps.sum() > 0:
        of = f" of class {w.traffic_class}" if w.traffic_class else ""
        return Problem(where, f"the trace's requests{of} carry fewer than 3 distinct "
                       "timestamps", Raw(f"{len(times)} in {src.path}"),
                       "request_rate: [req/s, ...]")
    rate = (len(times) - 1) / (times[-1] - times[0])
    cv = float(gaps.std() / gaps.mean())
    shape = float(np.clip(1 / cv**2, 0.01, 1000)) if cv > 0 else 1000.0
    return rate, round(shape, 3)


def objective_problems(spec: Spec, workloads: Mapping[str, WorkloadSpec],
                       split_of: Mapping[str, str]) -> list[Problem]:
    """Every class's workloads arrive as its objective measures: a latency class's at offered
    rates (open loop), a throughput class's with each concurrency level kept full. `workloads`:
    split traces' classes and services as workloads, before one per rate; `split_of`: a split
    class's workload by the trace workload's name (the field a problem names)."""
    classes = sorted({w.traffic_class or n for n, w in workloads.items()})
    out = [Problem(f"promote.objectives.{c}", "no workload is of this traffic class", c,
                   one_of(classes), did_you_mean(c, classes))
           for c in spec.promote.objectives if c not in classes]
    closed: dict[str, list[tuple[str, str]]] = {}  # a field: the classes it leaves unmeasured
    stated: dict[str, object] = {}  # ... and the arrival it states
    opened: dict[str, tuple[list[str], WorkloadSpec]] = {}  # ... throughput classes it opens
    answered: dict[str, set[str]] = {}  # a class: the objectives its workloads' points answer
    for name, w in workloads.items():
        answered.setdefault(w.traffic_class or name, set()).update(
            w.arrival.objectives if w.arrival is not None else {"throughput"})
    for name, w in workloads.items():
        cls = w.traffic_class or name
        objective = spec.promote.objective_for(cls)
        where = f"workload.{split_of.get(name, name)}.arrival"
        if objective in answered[cls]:
            continue
        if objective != "throughput":
            if isinstance(w.source, MixSource) and name in spec.service:
                out.append(Problem(f"promote.objectives.{cls}", "a service's windows mix its "
                                   f"classes in one closed loop; {objective} is measured at "
                                   "offered rates", objective, "throughput for a service"))
            else:
                closed.setdefault(where, []).append((cls, objective))
                stated[where] = w.arrival.model_dump(exclude_defaults=True) \
                    if w.arrival is not None else None
        elif w.arrival is not None:
            opened.setdefault(where, ([], w))[0].append(cls)
    for where, cs in closed.items():  # a split trace's classes: one problem
        objectives = sorted({o for _, o in cs})
        needs = {"latency": "request_rate: [...] (a trace: or trace_speed: [...])",
                 "capacity": "capacity_from: req/s"}
        out.append(Problem(where, f"traffic class{'es' * (len(cs) > 1)} "
                           f"{', '.join(repr(c) for c, _ in cs)} decided on "
                           f"{' or '.join(objectives)}, which is measured at offered request "
                           "rates", stated[where],
                           "arrival: {" + ", ".join(needs[o] for o in objectives)
                           + f"}}, or promote.objectives.{cs[0][0]}: throughput"))
    for where, (throughput, w) in opened.items():
        a = w.arrival
        assert a is not None
        out.append(Problem(where, "an open-loop workload's throughput is the rate it is "
                           "offered, not what the server can do",
                           a.request_rate or {"trace_speed": a.trace_speed}
                           if not a.capacity_from else {"capacity_from": a.capacity_from},
                           f"promote.objectives.{throughput[0]}: latency or capacity, arrival: "
                           "null (closed loop), or arrival.closed_loop: true (both, the open "
                           "loop answered beside)"))
    other = sorted({o for c in classes if (o := spec.promote.objective_for(c)) != "throughput"})
    if spec.sweep.design == "race" and spec.sweep.search == "adaptive" and other:
        out.append(Problem("sweep.search", "adaptive search predicts throughput from "
                           f"acceptance, and a class here is decided on {' and '.join(other)}",
                           "adaptive", "exhaustive"))
    return out


def _mixed_arrivals(spec: Spec, workloads: Mapping[str, WorkloadSpec]) -> list[Problem]:
    """A mix (a service, or a mix written in conf) sends its parts' requests in one closed-loop
    stream: an open-loop part cannot keep its arrival there."""
    problems = []
    for name, w in workloads.items():
        if not isinstance(w.source, MixSource):
            continue
        where = f"service.{name}.classes" if name in spec.service else \
            f"workload.{name}.source.parts"
        problems += [Problem(where, "an open-loop workload (arrival set) cannot be part of a "
                             "mix, whose windows are closed loop", p,
                             "workloads without arrival")
                     for p in w.source.parts if p in workloads and
                     workloads[p].arrival is not None]
    return problems


def _pinned(w: WorkloadSpec, src: TraceSource) -> WorkloadSpec:
    """The trace workload (one class, read when it is materialised) with the sha256 of the file
    as it is now (`TraceSource.sha256`), so a log replaced in place is another sweep; a file
    that cannot be read is left to the reader's problems."""
    try:
        digest = file_sha256(src.path)
    except OSError:
        return w
    if src.sha256 not in (None, digest):
        return w  # stated and different: the reader refuses it
    return w.model_copy(update={"source": src.model_copy(update={"sha256": digest})})


def _user_mix(name: str, mix: MixSource, declared: Mapping[str, WorkloadSpec]) -> list[Problem]:
    """A mix written in conf: its parts are other workloads, none of them a mix."""
    return [Problem(f"workload.{name}.source.parts", "not a workload to mix", p,
                    one_of(sorted(n for n, w in declared.items()
                                  if n != name and not isinstance(w.source, MixSource))),
                    did_you_mean(p, [n for n in declared if n != name]))
            for p in mix.parts if p == name or p not in declared
            or isinstance(declared[p].source, MixSource)]


def _read_key(src: TraceSource) -> str:
    """A trace as read: its file and the options it is read with (not the classes picked,
    which the reader does not filter by)."""
    return src.model_copy(update={"classes": None, "sha256": None}).model_dump_json()


def _split(name: str, w: WorkloadSpec, src: TraceSource, declared: Mapping[str, WorkloadSpec],
           read: dict[str, Trace]
           ) -> tuple[dict[str, WorkloadSpec], dict[str, tuple[str, float]], list[Problem]]:
    """One workload per class of the trace (named by the class), and each class's share; the
    trace read goes into `read`."""
    where = f"workload.{name}.source"
    trace = read[_read_key(src)] = read_trace(src.path, src)
    if trace.problems:
        return {}, {}, trace.all_problems(f"{where}.path")
    counts = trace.classes()
    total = sum(counts.values())
    problems: list[Problem] = []
    for c in src.classes or []:
        if c not in counts:
            problems.append(Problem(f"{where}.classes", "no request of the trace is of this "
                                    "class", c, one_of(sorted(counts)),
                                    did_you_mean(c, counts)))
    out: dict[str, WorkloadSpec] = {}
    shares: dict[str, tuple[str, float]] = {}
    for c in sorted(src.classes or counts):
        if c not in counts:
            continue
        if c in declared and c != name:
            problems.append(Problem(f"{where}.class_field", "a class of the trace has the name "
                                    "of another workload", c, "classes and workloads with "
                                    "distinct names (source.classes picks classes)"))
            continue
        if counts[c] < w.num_prompts:
            problems.append(Problem(f"workload.{name}.num_prompts", f"more prompts than class "
                                    f"'{c}' of {src.path} holds ({counts[c]} requests)",
                                    w.num_prompts, f"at most {counts[c]}, or source.classes "
                                    "without it"))
            continue
        out[c] = w.model_copy(update={"traffic_class": c, "source": src.model_copy(
            update={"classes": [c], "sha256": trace.sha256})})  # pinned as it was read
        shares[c] = (src.path, round(counts[c] / total, SHARE_DIGITS))
    return out, shares, problems


def _service(sname: str, svc: ServiceSpec, workloads: Mapping[str, WorkloadSpec],
             trace_share: Mapping[str, tuple[str, float]]) -> WorkloadSpec:
    """The workload a service's windows send: its classes' requests, mixed in their shares."""
    where = f"service.{sname}.classes"
    names = list(svc.classes)
    problems = [Problem(where, "no such workload", n, one_of(sorted(workloads)),
                        did_you_mean(n, workloads)) for n in names if n not in workloads]
    if len(set(names)) < 2:
        problems.append(Problem(where, "a service serves several classes", names,
                                "two or more workloads (or a trace split into two or more "
                                "classes)"))
    if sname in workloads:
        problems.append(Problem(f"service.{sname}", "a service has the name of a workload",
                                sname, "a name no workload has"))
    if svc.num_prompts < len(set(names)):
        problems.append(Problem(f"service.{sname}.num_prompts", "fewer requests than classes",
                                svc.num_prompts, f"at least one per class ({len(set(names))})"))
    if problems:
        raise SpecError(problems)
    if isinstance(svc.classes, dict):
        raw = dict(svc.classes)
    else:
        untraced = [n for n in names if n not in trace_share]
        files = {trace_share[n][0] for n in names if n in trace_share}
        if untraced or len(files) > 1:
            raise SpecError([Problem(where, "shares come from a trace only for the classes of "
                                     "one split trace", untraced or sorted(files),
                                     "the shares stated ({name: share, ...}), or classes of "
                                     "one trace split by its class field")])
        raw = {n: trace_share[n][1] for n in names}
    total = sum(raw.values())
    shares = {n: round(v / total, SHARE_DIGITS) for n, v in raw.items()}
    parts = [workloads[n] for n in names]
    for attr in ("temperature", "ignore_eos", "stop"):
        values = {repr(getattr(p, attr)) for p in parts}
        if len(values) > 1:
            problems.append(Problem(where, f"its classes' requests are sent with different "
                                    f"{attr} ({', '.join(sorted(values))}), and one window "
                                    "sends one", Raw(", ".join(names)),
                                    f"classes whose workloads share {attr}"))
    if problems:
        raise SpecError(problems)
    first = parts[0]
    return WorkloadSpec(
        traffic_class=sname, source=MixSource(parts=shares), num_prompts=svc.num_prompts,
        seed=svc.seed, max_tokens=max(p.max_tokens for p in parts),
        input_len=max(1, round(sum(shares[n] * workloads[n].input_len for n in names))),
        temperature=first.temperature, production_temperature=first.production_temperature,
        chat_template=False, stop=list(first.stop), ignore_eos=first.ignore_eos)
