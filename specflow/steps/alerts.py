"""Alerts users deploy: per promoted champion, Prometheus alerting rules and a Grafana dashboard
over vLLM's speculative-decoding counters, with the champion's measured bands as thresholds.

A rule fires when, over `watch.alert_window`, the live figure stays below the champion's
measured lower bound less `watch.tolerance` of its value for `watch.alert_for`:
- tokens per step: generated / (generated - accepted) (a drafter that stops proposing brings it
  to 1 while its acceptance length is untouched);
- acceptance length: 1 + accepted / drafts;
- the first three positions' acceptance: accepted at position i / drafts.
Every series is selected by the champion's serving labels (`model_name`, or `watch.selector`).
The dashboard plots the same figures against the bands, and the spec-decode throughput.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import yaml

from specflow.decision.watch import Band, Expected
from specflow.engine.metrics import ACCEPTED, ACCEPTED_PER_POS, DRAFT_TOKENS, DRAFTS
from specflow.engine.watching import M_GENERATED

POSITIONS_ALERTED = 3
"""Positions with a rule of their own (later ones move with acceptance length)."""


@dataclass(frozen=True)
class Watched:
    """One champion to alert on."""

    traffic_class: str
    version: str
    drafter: str
    selector: str
    """PromQL matchers, `{model_name="..."}`."""
    expected: Expected


def _dur(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 60}m" if s % 60 == 0 else f"{s}s"


def _sel(selector: str, extra: str = "") -> str:
    inner = selector.strip()[1:-1] if selector else ""
    both = ",".join(x for x in (inner, extra) if x)
    return f"{{{both}}}"


def _rate(metric: str, selector: str, window: str, extra: str = "") -> str:
    return f"sum(rate({metric}{_sel(selector, extra)}[{window}]))"


def expressions(selector: str, window: str) -> dict[str, str]:
    """The PromQL of each figure (`tokens per step`, `acceptance length`, `position i`)."""
    gen = _rate(M_GENERATED, selector, window)
    acc = _rate(ACCEPTED, selector, window)
    drafts = _rate(DRAFTS, selector, window)
    out = {"tokens per step": f"{gen} / ({gen} - {acc})",
           "acceptance length": f"1 + {acc} / {drafts}"}
    for i in range(8):
        at = _rate(ACCEPTED_PER_POS, selector, window, 'position="' + str(i) + '"')
        out[f"position {i + 1}"] = f"{at} / {drafts}"
    return out


def _threshold(b: Band, tolerance: float) -> float:
    return round(b.lo - tolerance * abs(b.value), 4)


def rules(watched: Sequence[Watched], *, window_s: float, for_s: float, tolerance: float
          ) -> dict[str, object]:
    """The alerting rules file (`groups:`), one group per champion."""
    window = _dur(window_s)
    groups = []
    for w in watched:
        exprs = expressions(w.selector, window)
        bands: list[tuple[str, str, Band | None]] = [
            ("SpecflowTokensPerStepLow", "tokens per step", w.expected.tokens_per_step),
            ("SpecflowAcceptanceLengthLow", "acceptance length", w.expected.acceptance_length)]
        bands += [("SpecflowPositionAcceptanceLow", f"position {i + 1}", b)
                  for i, b in enumerate(w.expected.rates[:POSITIONS_ALERTED])]
        out = []
        for alert, figure, band in bands:
            if band is None:
                continue
            low = _threshold(band, tolerance)
            labels: dict[str, str] = {"severity": "warning", "traffic_class": w.traffic_class,
                                      "champion": w.version, "drafter": w.drafter,
                                      "figure": figure}
            out.append({
                "alert": alert, "expr": f"({exprs[figure]}) < {low}", "for": _dur(for_s),
                "labels": labels,
                "annotations": {
                    "summary": f"{w.traffic_class}: {figure} below the champion's measured band",
                    "description": (
                        f"{figure} is {{{{ $value | printf \"%.3f\" }}}} over {window}; the "
                        f"{w.traffic_class} champion {w.version} ({w.drafter}, N={w.expected.n})"
                        f" measured {band.value:.3f} [{band.lo:.3f}, {band.hi:.3f}] "
                        f"({w.expected.label}). Re-sweep the class: python -m specflow watch "
                        f"{w.traffic_class} holds it with intervals; nothing is demoted on "
                        "production data alone.")}})
        groups.append({"name": f"specflow-{w.traffic_class}", "rules": out})
    return {"groups": groups}


def rules_yaml(watched: Sequence[Watched], **kw: float) -> str:
    return "# Emitted by python -m specflow alerts: one group per promoted champion.\n" + \
        yaml.safe_dump(rules(watched, **kw), sort_keys=False, width=10_000)


def dashboard(watched: Sequence[Watched], *, window_s: float, datasource: str = "prometheus"
              ) -> dict[str, object]:
    """A Grafana dashboard (built with grafana-foundation-sdk, Grafana's own builders): per
    champion, tokens per step, acceptance length and per-position acceptance against its
    measured bands, and the spec-decode throughput."""
    from grafana_foundation_sdk.builders import dashboard as gd
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.builders.common import GraphThresholdsStyleConfig
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.common import GraphTresholdsStyleMode
    from grafana_foundation_sdk.models.dashboard import DataSourceRef, Threshold, ThresholdsMode

    window = _dur(window_s)
    ds = DataSourceRef(type_val="prometheus", uid=datasource)
    board = (gd.Dashboard("specflow: speculative decoding in production")
             .uid("specflow-watch").tags(["specflow", "vllm", "speculative-decoding"])
             .refresh("30s").time("now-6h", "now").timezone("utc"))

    def panel(title: str, targets: Mapping[str, str], band: Band | None, unit: str,
              description: str) -> timeseries.Panel:
        p = (timeseries.Panel().title(title).description(description).datasource(ds)
             .unit(unit).height(8).span(12))
        for legend, expr in targets.items():
            p = p.with_target(prometheus.Dataquery().expr(expr).legend_format(legend))
        if band is not None:
            steps = [Threshold(None, "red"), Threshold(band.lo, "green")]
            p = (p.thresholds(gd.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(steps))
                 .thresholds_style(GraphThresholdsStyleConfig().mode(
                     GraphTresholdsStyleMode.DASHED)))
        return p

    for w in watched:
        exprs = expressions(w.selector, window)
        e = w.expected
        board = board.with_row(gd.Row(f"{w.traffic_class}: champion {w.version} ({w.drafter}, "
                                      f"N={e.n})"))

        def about(b: Band | None, label: str = e.label) -> str:
            return "" if b is None else (f"measured {b.value:.3f} [{b.lo:.3f}, {b.hi:.3f}] "
                                         f"({label}); red below the lower bound")

        board = board.with_panel(panel("tokens per step", {"live": exprs["tokens per step"]},
                                       e.tokens_per_step, "none", about(e.tokens_per_step)))
        board = board.with_panel(panel("acceptance length",
                                       {"live": exprs["acceptance length"]},
                                       e.acceptance_length, "none", about(e.acceptance_length)))
        per_pos = (f"sum by (position) (rate({ACCEPTED_PER_POS}{_sel(w.selector)}[{window}])) "
                   f"/ ignoring(position) group_left {_rate(DRAFTS, w.selector, window)}")
        board = board.with_panel(panel(
            "acceptance per position", {"position {{position}}": per_pos},
            e.rates[0] if e.rates else None, "percentunit",
            "; ".join(f"position {i + 1}: {b.value:.3f} [{b.lo:.3f}, {b.hi:.3f}]"
                      for i, b in enumerate(e.rates))))
        board = board.with_panel(panel(
            "spec-decode throughput (tokens/s)",
            {"generated": _rate(M_GENERATED, w.selector, window),
             "accepted": _rate(ACCEPTED, w.selector, window),
             "drafted": _rate(DRAFT_TOKENS, w.selector, window)}, None, "short",
            "generated, accepted and drafted tokens per second"))
    out: dict[str, object] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return out
