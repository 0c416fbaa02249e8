"""`python -m specflow watch CLASS`: the champion of a traffic class, as it serves, held against
what was measured when it was chosen (specflow.decision.watch for the rules,
specflow.engine.watching for the sources, docs/watching.md for the user's view).

What the counters are held against, first found first:
- `watch.reference`: a reference curve (acceptance length per N);
- `watch.profile`: an acceptance profile file (`python -m specflow profile SWEEP --out DIR`);
- the class's champion: its drafter's profile on the class, built from the windows of the sweep
  that promoted it (its ledger, or the MLflow parent run's windows).
N is `watch.num_speculative_tokens`, else the champion's, else as many positions as the live
counters have. A profile of another drafter or target than the champion's is refused, and so is
a server that serves another model than the champion's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from specflow.champions import promote
from specflow.decision import watch as rules
from specflow.engine import watching
from specflow.results import comparing
from specflow.search import profiles
from specflow.spec import profile as profile_file
from specflow.spec.errors import Problem, SpecError
from specflow.spec.schema import Spec

EXIT_DROP = comparing.EXIT_REGRESSION
"""`watch`'s exit code when acceptance dropped beyond noise (as `compare`'s for a regression)."""
EXIT_NOTHING = comparing.EXIT_NOT_COMPARABLE
"""`watch`'s exit code when no window had traffic, or one only."""

OnWindow = Callable[[rules.Window], None]


@dataclass(frozen=True)
class Watching:
    """What one class's watch holds the counters against, and how it reaches the servers."""

    traffic_class: str
    profile: profile_file.AcceptanceProfile | None
    reference: profile_file.ReferenceCurve | None
    n: int | None
    """N the servers run (None: read from the counters)."""
    speedup: float | None
    served: str | None
    """The champion's served model name (None: no champion, or none in its argv)."""
    champion: str | None
    """The champion's version."""
    workloads: tuple[str, ...] = ()
    """The workloads the profile was measured on (a re-sweep measures them)."""

    def expected(self, n: int) -> rules.Expected:
        if self.reference is not None:
            got = rules.from_reference(self.reference, n, self.speedup)
            if got is None:
                raise SpecError([Problem("watch.reference", f"has no acceptance length at N={n}",
                                         self.reference.name, "a curve with N="
                                         f"{n} among its points (it has N = "
                                         f"{', '.join(str(p.n) for p in self.reference.points)})")])
            return got
        assert self.profile is not None
        if n > self.profile.n_max:
            raise SpecError([Problem("watch.num_speculative_tokens", "the servers draft more "
                                     "tokens than the profile measured", n,
                                     f"at most {self.profile.n_max} (the profile's largest N), "
                                     "or a profile measured at this N")])
        return rules.from_profile(self.profile, n, self.speedup)


def _model_path(argv: tuple[str, ...]) -> str | None:
    return argv[2] if len(argv) > 2 and argv[:2] == ("vllm", "serve") else None


def _served(argv: tuple[str, ...]) -> str | None:
    for flag, value in zip(argv, argv[1:], strict=False):
        if flag == "--served-model-name":
            return value
    return _model_path(argv)


def _bare(target: str) -> str:
    return target.rsplit("@", 1)[0] if "@" in target else target


def resolve(spec: Spec, traffic_class: str, *, source: bool = True) -> Watching:
    """What the class's watch holds the counters against; SpecError (exit 2) with every
    problem. `source`: the watch reads servers, so it needs exactly one source (`alerts`
    does not)."""
    w = spec.watch
    problems: list[Problem] = []
    if not promote.is_plain_name(traffic_class):
        raise SpecError([Problem("watch CLASS", "not a plain traffic class name", traffic_class,
                                 promote.PLAIN)])
    if source and (w.metrics_url is None) == (w.prometheus_url is None):
        problems.append(Problem("watch.metrics_url", "a watch reads one source", None if
                                w.metrics_url is None else w.metrics_url, "watch.metrics_url "
                                "(a server's /metrics) or watch.prometheus_url, one of them"))
    champ = promote.champion(spec.promote.output_dir, traffic_class)
    speedup = n = served = None
    if champ is not None and champ.outcome == "promote":
        n = champ.engine.num_speculative_tokens
        served = _served(champ.serve_argv)
        worst = [b.speedup.estimate for b in champ.bands if b.outcome == "promote"]
        speedup = min(worst) if worst else None
    n = w.num_speculative_tokens or n
    reference = prof = None
    if w.reference:
        try:
            reference = profile_file.import_curve(w.reference)
        except ValueError as exc:
            problems.append(Problem("watch.reference", str(exc), w.reference,
                                    "a reference curve: CSV or JSON of N and acceptance length"))
    elif w.profile:
        try:
            prof = profile_file.read(w.profile)
        except ValueError as exc:
            problems.append(Problem("watch.profile", str(exc), w.profile,
                                    "a profile file (python -m specflow profile SWEEP --out DIR)"))
    elif champ is None:
        problems.append(Problem("watch CLASS", "no champion of this class to watch",
                                traffic_class, f"a class promoted under {spec.promote.output_dir} "
                                f"({', '.join(_classes(spec)) or 'none there'}), or "
                                "watch.profile / watch.reference"))
    elif champ.outcome != "promote":
        problems.append(Problem("watch CLASS", "its champion serves without speculation: there "
                                "is no acceptance to watch", traffic_class,
                                "a class whose champion speculates"))
    else:
        prof = _champion_profile(spec, traffic_class, champ, problems)
    if prof is not None and champ is not None and champ.outcome == "promote":
        if prof.drafter != champ.engine.drafter:
            problems.append(Problem("watch.profile", f"is a profile of drafter '{prof.drafter}'; "
                                    f"the {traffic_class} champion drafts with "
                                    f"'{champ.engine.drafter}'", w.profile or prof.drafter,
                                    f"a profile of '{champ.engine.drafter}'"))
        path = _model_path(champ.serve_argv)
        # a path relative to where the sweep ran, or a hub id beside its local copy: the same
        # target when the last components agree
        if path is not None and Path(_bare(prof.target)).name != Path(path).name:
            problems.append(Problem("watch.profile", f"is a profile of target '{prof.target}'; "
                                    f"the {traffic_class} champion serves '{path}'",
                                    w.profile or prof.target, f"a profile of '{path}'"))
    if problems:
        raise SpecError(problems)
    return Watching(traffic_class, prof, reference, n, speedup, served,
                    str(champ.version) if champ is not None and champ.outcome == "promote"
                    else None,
                    prof.workloads if prof is not None else ())


def _classes(spec: Spec) -> list[str]:
    return promote.promoted(spec.promote.output_dir)


def promoted_classes(spec: Spec) -> list[str]:
    """The classes whose champion speculates."""
    return [c for c in _classes(spec)
            if (ch := promote.champion(spec.promote.output_dir, c)) is not None
            and ch.outcome == "promote"]


def _champion_profile(spec: Spec, cls: str, champ: promote.GatedRecord,
                      problems: list[Problem]) -> profile_file.AcceptanceProfile | None:
    side = comparing.resolve(f"{comparing.CHAMPION_PREFIX}{cls}", "watch CLASS",
                             workdir=spec.tracking.workdir, tracking_uri=spec.tracking.uri,
                             output_dir=spec.promote.output_dir)
    found = [p for p in profiles.build(side.measurements, side.pins, sweep_id=side.sweep_id,
                                       confidence=spec.promote.confidence)
             if p.traffic_class == cls and p.drafter == champ.engine.drafter]
    if not found:
        problems.append(Problem("watch CLASS", f"the sweep that promoted it ({side.label}) has "
                                f"no per-position acceptance of '{champ.engine.drafter}' on the "
                                "class", cls, "watch.profile or watch.reference"))
        return None
    return min(found, key=lambda p: p.temperature)


# --------------------------------------------------------------------------------------------
# Reading the servers


def _labels(selector: str | None) -> dict[str, str]:
    """`{a="x",b="y"}` equality matchers as labels (a /metrics page has no query language)."""
    out = {}
    for part in (selector or "{}").strip()[1:-1].split(","):
        if "=" in part and "!=" not in part and "=~" not in part:
            k, v = part.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def read_direct(url: str, selector: str | None, window_s: float, count: int, scrape_s: float,
                on_window: OnWindow | None = None, *, clock: Callable[[], float] = time.time,
                sleep: Callable[[float], None] = time.sleep) -> tuple[float, list[rules.Reading]]:
    """Read a server's /metrics every `scrape_s` for `count` windows of `window_s`: (start,
    readings). WatchError when the first reading shows no vLLM or no speculative decoding."""
    labels = _labels(selector)
    first = watching.scrape(url, labels=labels, first=True)
    watching.check_server(first, url)
    start = first.reading.t
    readings = [first.reading]
    end, done = start + count * window_s, 0
    while True:
        next_t = min(readings[-1].t + scrape_s, end)
        sleep(max(0.0, next_t - clock()))
        got = watching.scrape(url, labels=labels)
        if got.reading.values and not got.speculative:
            raise watching.WatchError(f"{url} now serves without speculative decoding")
        readings.append(got.reading)
        closed = min(count, math.floor((got.reading.t - start) / window_s))
        if on_window is not None and closed > done:
            for w in rules.windows(readings, start, window_s, count)[done:closed]:
                on_window(w)
        done = max(done, closed)
        if got.reading.t >= end:
            return start, readings


def read_prometheus(url: str, selector: str | None, window_s: float, count: int,
                    scrape_s: float, *, end: float | None = None
                    ) -> tuple[float, list[rules.Reading]]:
    """The last `count` windows of `window_s` from Prometheus (to `end`, default now)."""
    end = time.time() if end is None else end
    start = end - count * window_s
    return start, watching.prometheus_readings(url, selector or "", start - scrape_s, end,
                                               scrape_s)


def served_models(metrics_url: str) -> dict[str, str]:
    """/v1/models of the server behind a /metrics URL: served name -> model path (empty when it
    does not answer)."""
    base = metrics_url.rsplit("/metrics", 1)[0]
    try:
        data = httpx.get(f"{base}/v1/models", timeout=10.0).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return {m.get("id", ""): m.get("root", "") for m in data.get("data", [])
            if isinstance(m, dict)}


def run(spec: Spec, target: Watching, on_window: OnWindow | None = None) -> rules.Watched:
    """Read the servers (`spec.watch`) and hold their windows against `target`; WatchError when
    a source cannot be watched."""
    w = spec.watch
    selector = w.selector or (f'{{model_name="{target.served}"}}' if target.served else None)
    if w.metrics_url:
        models = served_models(w.metrics_url)
        if target.served and models and target.served not in models:
            raise watching.WatchError(
                f"{w.metrics_url} serves {', '.join(sorted(models))}; the "
                f"{target.traffic_class} champion serves '{target.served}'")
        if target.profile is not None and not target.served and models and not any(
                _bare(target.profile.target) in (name, root, Path(root).name)
                or Path(_bare(target.profile.target)).name in (name, Path(root).name)
                for name, root in models.items()):
            raise watching.WatchError(
                f"{w.metrics_url} serves {', '.join(sorted(models))}; the profile is of target "
                f"'{target.profile.target}'")
        start, readings = read_direct(w.metrics_url, selector, w.window_s, w.windows,
                                      w.scrape_s, on_window)
    else:
        assert w.prometheus_url is not None
        start, readings = read_prometheus(w.prometheus_url, selector, w.window_s, w.windows,
                                          w.scrape_s, end=w.end)
    ws = rules.windows(readings, start, w.window_s, w.windows)
    if on_window is not None and not w.metrics_url:
        for one in ws:
            on_window(one)
    n = target.n or max((len(x.per_position) for x in ws), default=0)
    if not n:
        return rules.Watched(rules.Expected("nothing", 0, None), tuple(ws), (),
                             "no traffic" if not any(x.traffic for x in ws) else
                             "too few windows", notes=("no draft positions in any window",))
    return rules.watch(ws, target.expected(n), confidence=spec.promote.confidence,
                       tolerance=w.tolerance)


def exit_code(got: rules.Watched) -> int:
    if got.dropped:
        return EXIT_DROP
    if got.outcome in ("no traffic", "too few windows", "nothing to hold"):
        return EXIT_NOTHING
    return 0


# --------------------------------------------------------------------------------------------
# Showing it


def _band(b: rules.Band | None, digits: int = 3) -> str:
    if b is None:
        return "-"
    return f"{b.value:.{digits}f} [{b.lo:.{digits}f}, {b.hi:.{digits}f}]"


def window_line(w: rules.Window) -> str:
    """One window as the console prints it while the watch reads."""
    al, tps, note = w.acceptance_length, w.tokens_per_step, w.note()
    when = time.strftime("%H:%M:%S", time.gmtime(w.start))
    return (f"window {when}Z +{w.end - w.start:g}s: {w.generated} tokens, {w.drafts} drafts, "
            f"acceptance length {'-' if al is None else f'{al:.2f}'}"
            + (f", {tps:.2f} tokens per step" if tps else "") + (f" ({note})" if note else ""))


def rows(got: rules.Watched) -> list[dict[str, str]]:
    """The figures as table rows (the console's, the Prefect artifact's)."""
    out = []
    for r in got.rows:
        change = r.change
        out.append({"figure": r.figure, "live": _band(r.live), "reference": _band(r.reference),
                    "change": "-" if change is None else f"{change:+.1%}",
                    "verdict": r.verdict or r.why})
    return out


def summary(target: Watching, got: rules.Watched) -> str:
    """The last line: the outcome, and the throughput it predicts."""
    head = f"{target.traffic_class}: {got.outcome}"
    if got.rows:
        head += f" against {got.expected.label} at N={got.expected.n}"
    with_traffic = sum(1 for w in got.windows if w.traffic)
    head += f" ({with_traffic} of {len(got.windows)} windows with traffic)"
    if got.predicted is not None:
        head += f"; predicts {got.predicted:.2f}x the measured speedup"
        if got.predicted_speedup is not None:
            head += f" ({got.expected.speedup:.2f}x -> {got.predicted_speedup:.2f}x)"
    return head


def table(target: Watching, got: rules.Watched) -> str:
    """The watch's answer as plain text (the console's)."""
    lines = [f"{'figure':<18} {'live':<26} {'reference':<26} {'change':>8}  verdict"]
    lines += [f"{r['figure']:<18} {r['live']:<26} {r['reference']:<26} {r['change']:>8}  "
              f"{r['verdict']}" for r in rows(got)]
    lines += [f"note: {n}" for n in got.notes]
    lines.append(summary(target, got))
    return "\n".join(lines) + "\n"


def as_json(target: Watching, got: rules.Watched) -> dict[str, Any]:
    return {
        "traffic_class": target.traffic_class, "champion": target.champion,
        "outcome": got.outcome, "against": got.expected.label, "n": got.expected.n,
        "predicted_speedup_factor": got.predicted, "predicted_speedup": got.predicted_speedup,
        "rows": [{"figure": r.figure, "verdict": r.verdict, "why": r.why, "change": r.change,
                  "live": None if r.live is None else [r.live.value, r.live.lo, r.live.hi],
                  "reference": None if r.reference is None else
                  [r.reference.value, r.reference.lo, r.reference.hi]} for r in got.rows],
        "windows": [{"start": w.start, "end": w.end, "generated": w.generated,
                     "drafts": w.drafts, "accepted": w.accepted,
                     "per_position": list(w.per_position), "resets": w.resets,
                     "unread": w.unread, "note": w.note()} for w in got.windows],
        "notes": list(got.notes),
    }
