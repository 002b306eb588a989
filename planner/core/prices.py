"""Price sets: what a GPU-hour costs, on one basis per set.

A set (planner/data/prices/<name>.yaml, or a user's file of the same schema) prices every GPU
it covers on one basis: a hyperscaler's on-demand list price, the median of specialty clouds'
on-demand prices, a one- or three-year commitment, or owning the GPU. Costs are only
comparable within one set, so a plan ranks within one. A GPU a set does not sell is listed in
it with the reason (``not_sold``). Per GPU a listed set gives its figure and the offers it
was derived from (the lowest of the hyperscalers' offers, the median of the specialty
clouds'; ``check_derived`` holds each figure to its offers); the owned set gives the purchase
price and the board power, and the hourly figure is

    purchase_usd / (life_years x 8760 h) + power_w / 1000 x pue x usd_per_kwh

with the set's assumptions (``OwnedAssumptions``), each with its source. Pure: the loader
lives in ``planner.io.catalog``.
"""

from __future__ import annotations

import statistics
from typing import Annotated, Any

from pydantic import Discriminator, Field, Tag, model_validator

from planner.core.specs import Price, _Frozen

HOURS_PER_YEAR = 8760


class Offer(_Frozen):
    """One provider's price per GPU-hour (an instance's price / its GPUs)."""

    provider: str = Field(min_length=1)
    usd_per_gpu_hour: float = Field(gt=0, le=10_000)
    source: str = Field(min_length=1)
    date: str = Field(min_length=1)
    instance: str | None = None
    region: str | None = None
    note: str | None = None
    estimated: bool = False


class Listed(_Frozen):
    """A GPU's figure in a listed set, and the offers it comes from."""

    usd_per_gpu_hour: float = Field(gt=0, le=10_000)
    offers: tuple[Offer, ...] = Field(min_length=1)
    note: str | None = None
    estimated: bool = False


class Owned(_Frozen):
    """A GPU bought: its price and its board power."""

    purchase_usd: float = Field(gt=0, le=10_000_000)
    power_w: float = Field(gt=0, le=100_000)
    source: str = Field(min_length=1)
    power_source: str = Field(min_length=1)
    date: str = Field(min_length=1)
    note: str | None = None
    estimated: bool = False


class NotSold(_Frozen):
    not_sold: str = Field(min_length=1)


def _entry_kind(v: Any) -> str | None:
    """Which kind of price entry a GPU's mapping is, by the keys it gives (so an error names
    that kind's fields, not every kind's)."""
    if isinstance(v, dict):
        return "NotSold" if "not_sold" in v else "Owned" if "purchase_usd" in v else "Listed"
    return type(v).__name__ if isinstance(v, Listed | Owned | NotSold) else None


# a GPU's entry in a price set; the tags are the classes' names, which error paths leave out
Entry = Annotated[Annotated[Listed, Tag("Listed")] | Annotated[Owned, Tag("Owned")]
                  | Annotated[NotSold, Tag("NotSold")], Discriminator(
                      _entry_kind, custom_error_type="price_entry",
                      custom_error_message="expected a price entry: a mapping with "
                      "usd_per_gpu_hour and offers (a listed price), purchase_usd (an owned "
                      "GPU) or not_sold")]
ENTRY_TAGS = frozenset({"Listed", "Owned", "NotSold"})


class Assumption(_Frozen):
    """A figure the owned basis rests on, with its source (or its reason where it is a
    choice, such as a depreciation life)."""

    value: float = Field(gt=0, le=1_000_000)
    source: str | None = None
    reason: str | None = None
    date: str | None = None

    @model_validator(mode="after")
    def _sourced(self) -> Assumption:
        if not (self.source or self.reason):
            raise ValueError("give a source or a reason")
        return self


class OwnedAssumptions(_Frozen):
    life_years: Assumption
    pue: Assumption
    usd_per_kwh: Assumption

    @model_validator(mode="after")
    def _physical(self) -> OwnedAssumptions:
        if self.pue.value < 1:
            raise ValueError(f"pue: {self.pue.value:g} is below 1 (a data centre cannot use "
                             "less power than its IT load)")
        return self


class PriceSet(_Frozen):
    """One basis of prices (a file of planner/data/prices)."""

    name: str = Field(min_length=1)
    title: str = Field(min_length=1)
    basis: str = Field(min_length=1)
    date: str = Field(min_length=1)
    notes: tuple[str, ...] = ()
    # the owned basis's assumptions; a set with them prices GPUs by purchase and power
    assumptions: OwnedAssumptions | None = None
    gpus: dict[str, Entry]

    @property
    def kind(self) -> str:
        """"owned" (purchase and power) or "listed" (prices per GPU-hour)."""
        return "owned" if self.assumptions is not None else "listed"

    @model_validator(mode="after")
    def _consistent(self) -> PriceSet:
        owned = [n for n, g in self.gpus.items() if isinstance(g, Owned)]
        listed = [n for n, g in self.gpus.items() if isinstance(g, Listed)]
        if owned and self.assumptions is None:
            raise ValueError(f"gpus.{owned[0]}: purchase_usd needs the set's assumptions "
                             "(life_years, pue, usd_per_kwh)")
        if self.kind == "owned":
            if listed:
                raise ValueError(f"gpus.{listed[0]}: an owned set gives purchase_usd and "
                                 "power_w, not usd_per_gpu_hour")
        return self

    def entry(self, gpu: str) -> Listed | Owned | NotSold | None:
        return self.gpus.get(gpu)

    def hourly(self, gpu: str) -> float | None:
        """USD per GPU-hour of ``gpu`` in this set (None: not sold here, or not listed)."""
        g = self.gpus.get(gpu)
        if isinstance(g, Listed):
            return g.usd_per_gpu_hour
        if isinstance(g, Owned):
            a = self.assumptions
            return (g.purchase_usd / (a.life_years.value * HOURS_PER_YEAR)
                    + g.power_w / 1000 * a.pue.value * a.usd_per_kwh.value)
        return None

    def price(self, gpu: str) -> Price | None:
        """``gpu``'s price in this set as hardware_db's ``Price`` (its source: the set and
        the offer or purchase source behind it)."""
        v = self.hourly(gpu)
        if v is None:
            return None
        g = self.gpus[gpu]
        if isinstance(g, Listed):
            best = min(g.offers, key=lambda o: abs(o.usd_per_gpu_hour - v))
            src, date = best.source, best.date
            label = f"{best.provider} {best.instance or ''}".rstrip()
            if len(g.offers) > 1:
                label += f" (of {len(g.offers)} offers)"
        else:
            a = self.assumptions
            src, date = g.source, g.date
            label = (f"${g.purchase_usd:,.0f} over {a.life_years.value:g} y + {g.power_w:g} W "
                     f"x PUE {a.pue.value:g} at ${a.usd_per_kwh.value:g}/kWh")
        return Price(usd_per_gpu_hour=round(v, 6), source=src, date=date,
                     note=f"price set {self.name} ({self.title}, {self.date})",
                     price_set=self.name, label=label)

    def not_sold(self, gpu: str) -> str:
        """Why ``gpu`` has no price in this set."""
        g = self.gpus.get(gpu)
        if isinstance(g, NotSold):
            return g.not_sold
        return f"not listed in price set {self.name}"


def derived(kind: str, offers) -> float:
    """The figure a listed set derives from its offers: the lowest (``low``) or the median."""
    xs = [o.usd_per_gpu_hour for o in offers]
    return min(xs) if kind == "low" else statistics.median(xs)


def check_derived(ps: PriceSet, rule: str, *, rel: float = 1e-3) -> list[str]:
    """The GPUs whose figure is not ``rule`` ("low" or "median") of their offers."""
    bad = []
    for name, g in ps.gpus.items():
        if isinstance(g, Listed):
            want = derived(rule, g.offers)
            if abs(g.usd_per_gpu_hour - want) > rel * want:
                bad.append(f"{name}: {g.usd_per_gpu_hour:g} is not the {rule} of its offers "
                           f"({want:g})")
    return bad
