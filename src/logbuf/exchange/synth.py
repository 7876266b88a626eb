"""A synthetic TotalView-ITCH 5.0 day: deterministic for a seed, any size, streamed in constant memory.

The day, in order of time (ns since midnight)::

    03:00:00  S/O start of messages, V, then R (every symbol), H 'T' (every symbol), some Y and L
    04:00:00  S/S start of system hours; pre-market order flow begins (low intensity)
    09:25:00  NOII (I) every 10 s for the NOII symbols, until the open
    09:30:00  S/Q start of market hours, then a cross trade (Q, type O) per symbol; intensity spike
    15:50:00  NOII (I) every 20 s until the close
    16:00:00  S/M end of market hours, then a closing cross (Q, type C) per symbol; after-hours flow
    20:00:00  S/E end of system hours
    20:05:00  S/C end of messages

Order flow is generated in vectorised chunks (numpy) from a stateful book per symbol:

- every symbol owns ``orders_per_symbol`` slots; a live order lives in one slot. Each chunk touches a slot at
  most once, so the state at the start of the chunk is the state every event in the chunk sees — that is what
  lets a whole chunk be decided at once;
- E, C, X, D and U always name a live order (chosen among the live slots); U retires the old reference and puts
  the new one in the same slot; E/C that execute the remaining shares and D free the slot;
- order references are unique and increasing in file order (A, F and U's new reference draw from one counter);
  match numbers likewise for E, C, P and Q;
- books never cross: each symbol has a fixed reference price, bids rest at least one tick below it and asks at
  least one tick above;
- the generator's memory is bounded: when an add lands on an occupied slot (the symbol's pool is full), the
  previous order is no longer tracked and rests on the book untouched for the rest of the day, as many real
  orders do. With the default "open" mix (adds outnumber removals, as at a real open) roughly a third of adds
  end up resting; the "balanced" mix keeps adds and removals about equal.

Timing: 1-second bins from 04:00 to 20:00 get a U-shaped base intensity with a spike at 09:30, multiplied by a
self-exciting (Hawkes-like, discretised) excitation; the message total is spread over the bins by a multinomial
draw. Inside a bin, gaps come from a mixture (exact zero = same-nanosecond runs, short in-burst gaps, long gaps)
scaled to fit the bin.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from logbuf.errors import LogbufError
from logbuf.exchange.dayfile import LENGTH_PREFIX_SIZE, DayFileWriter
from logbuf.marketdata import itch

NS = 1_000_000_000
HOUR = 3600 * NS
MINUTE = 60 * NS

START_OF_MESSAGES_NS = 3 * HOUR
START_OF_SYSTEM_HOURS_NS = 4 * HOUR
OPENING_NOII_START_NS = 9 * HOUR + 25 * MINUTE
OPEN_NS = 9 * HOUR + 30 * MINUTE
CLOSING_NOII_START_NS = 15 * HOUR + 50 * MINUTE
CLOSE_NS = 16 * HOUR
END_OF_SYSTEM_HOURS_NS = 20 * HOUR
END_OF_MESSAGES_NS = 20 * HOUR + 5 * MINUTE
OPENING_NOII_INTERVAL_NS = 10 * NS
CLOSING_NOII_INTERVAL_NS = 20 * NS

MAX_SYMBOLS = 65_535  # stock locate is a 16-bit field
BIN_NS = NS  # intensity bins of one second over the order-flow window [04:00, 20:00)
PRICE_TICK = 100  # $0.01 in Price(4)
ROUND_LOT = 100

# Event mixes of the order flow (weights; normalised on use). "open" follows a real open (see the reference
# cut: A 36.7%, U 22.5%, F 19.3%, D 16.7%, E 2.8%, X 0.6%, P 0.4%); "balanced" keeps the book size stable.
MIXES: dict[str, dict[bytes, float]] = {
    "open": {b"A": 37.0, b"U": 22.0, b"F": 19.0, b"D": 17.0, b"E": 2.8, b"X": 0.7, b"C": 0.3, b"P": 0.4},
    "balanced": {b"A": 38.0, b"U": 12.0, b"F": 6.0, b"D": 36.0, b"E": 5.5, b"X": 1.0, b"C": 0.5, b"P": 1.0},
}
_MODIFY_KINDS = (b"U", b"D", b"E", b"X", b"C")
_ADD_KINDS = (b"A", b"F")
_MPIDS = np.array([b"GSCO", b"MSCO", b"UBSS", b"NITE", b"VIRT", b"CDRG", b"JPMS", b"LATS"], dtype="S4")


class SynthError(LogbufError, ValueError):
    """A synthetic day cannot be made with this configuration (too few messages, unknown mix, ...)."""


@dataclass(frozen=True)
class SynthConfig:
    messages: int = 1_000_000
    seed: int = 1
    symbols: int | None = None  # None: scaled with the message count
    orders_per_symbol: int = 64
    chunk_messages: int = 65_536
    mix: str = "open"

    def symbol_count(self) -> int:
        if self.symbols is not None:
            return self.symbols
        return int(min(1000, max(4, self.messages // 2_000)))

    def noii_symbol_count(self) -> int:
        # NOII takes about 1% of the day at most (60 NOII slots per symbol: 30 before each cross).
        return int(max(1, min(self.symbol_count(), self.messages // 6_000)))


def fixed_message_count(config: SynthConfig) -> int:
    """Messages that are not order flow: system events, directory, crosses, NOII."""
    s = config.symbol_count()
    system_events = 6
    per_symbol = 4  # R, H, opening Q, closing Q
    reg_sho = _reg_sho_count(s)
    participants = _participant_count(s)
    noii = config.noii_symbol_count() * (_noii_times(OPENING_NOII_START_NS, OPEN_NS, OPENING_NOII_INTERVAL_NS).size
                                         + _noii_times(CLOSING_NOII_START_NS, CLOSE_NS, CLOSING_NOII_INTERVAL_NS).size)
    return system_events + 1 + per_symbol * s + reg_sho + participants + noii  # + 1: the V message


def _reg_sho_count(symbols: int) -> int:
    return max(1, symbols // 20)


def _participant_count(symbols: int) -> int:
    return min(symbols, 50)


def _noii_times(start: int, end: int, interval: int) -> np.ndarray:
    return np.arange(start, end, interval, dtype=np.int64)


class _Scheduled(NamedTuple):
    timestamp: int
    message: itch.Message


class _Universe:
    """Symbols: names, locates (1-based), reference prices, popularity."""

    def __init__(self, rng: np.random.Generator, count: int) -> None:
        self.count = count
        self.names = self._names(rng, count)
        # log-uniform reference prices between $5 and $500, on the tick grid
        dollars = np.exp(rng.uniform(math.log(5.0), math.log(500.0), count))
        self.mid = (np.round(dollars * 100) * PRICE_TICK).astype(np.int64)
        # popularity: Zipf-like, in random symbol order
        weights = 1.0 / np.arange(1, count + 1) ** 0.9
        self.popularity = rng.permutation(weights / weights.sum())

    @staticmethod
    def _names(rng: np.random.Generator, count: int) -> np.ndarray:
        letters = np.frombuffer(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ", dtype=np.uint8)
        seen: set[bytes] = set()
        names: list[bytes] = []
        while len(names) < count:
            length = int(rng.integers(1, 6))
            name = letters[rng.integers(0, 26, length)].tobytes()
            if name not in seen:
                seen.add(name)
                names.append(name.ljust(8))
        return np.array(names, dtype="S8")


class _Book:
    """Live orders of every symbol in fixed slots: slot = symbol_index * orders_per_symbol + k."""

    def __init__(self, symbols: int, per_symbol: int) -> None:
        size = symbols * per_symbol
        self.per_symbol = per_symbol
        self.live = np.zeros(size, dtype=bool)
        self.ref = np.zeros(size, dtype=np.uint64)
        self.sell = np.zeros(size, dtype=bool)
        self.price = np.zeros(size, dtype=np.int64)
        self.shares = np.zeros(size, dtype=np.int64)


def _intensity(rng: np.random.Generator) -> np.ndarray:
    """Expected relative message rate of each one-second bin of [04:00, 20:00)."""
    bins = (END_OF_SYSTEM_HOURS_NS - START_OF_SYSTEM_HOURS_NS) // BIN_NS
    t = START_OF_SYSTEM_HOURS_NS + np.arange(bins, dtype=np.int64) * BIN_NS
    s_open = (t - OPEN_NS) / NS
    s_close = (CLOSE_NS - t) / NS
    regular = (t >= OPEN_NS) & (t < CLOSE_NS)
    base = np.where(regular, 1.0, 0.04)
    # U shape: elevated after the open and before the close, plus the spike of the opening seconds
    after_open = np.clip(s_open, 0, None)
    before_close = np.clip(s_close, 0, None)
    base = base + regular * (4.0 * np.exp(-after_open / 900.0) + 2.5 * np.exp(-before_close / 1200.0))
    base = base + regular * 150.0 * np.exp(-after_open / 2.0)
    pre = t < OPEN_NS
    base = base + pre * 0.3 * np.exp(-np.clip(-s_open, 0, None) / 300.0)  # pre-market build-up to the open
    # Hawkes-like excitation: exogenous shocks plus events triggered in proportion to the excitation itself
    decay = math.exp(-1.0 / 20.0)
    shocks = rng.random(bins) < 1.0 / 300.0
    sizes = rng.pareto(2.5, bins) + 1.0
    triggers = rng.random(bins)
    excitation = np.empty(bins)
    e = 0.0
    for k in range(bins):
        jump = sizes[k] if shocks[k] or triggers[k] < 0.02 * e else 0.0
        e = e * decay + jump
        excitation[k] = e
    return base * (1.0 + excitation)


def _order_flow_pieces(
    rng: np.random.Generator, total: int, max_piece: int
) -> Iterator[tuple[int, int, int]]:
    """(start ns, duration ns, count) pieces covering the order-flow window, counts summing to ``total``."""
    intensity = _intensity(rng)
    counts = rng.multinomial(total, intensity / intensity.sum())
    for k in np.flatnonzero(counts):
        count = int(counts[k])
        start = START_OF_SYSTEM_HOURS_NS + int(k) * BIN_NS
        parts = -(-count // max_piece)
        for p in range(parts):
            yield start + p * BIN_NS // parts, BIN_NS // parts, count // parts + (p < count % parts)


def _flow_timestamps(rng: np.random.Generator, pieces: list[tuple[int, int, int]]) -> np.ndarray:
    """Sorted timestamps: gap mixture per message, scaled so each piece's messages fit in the piece."""
    counts = np.array([c for _, _, c in pieces], dtype=np.int64)
    n = int(counts.sum())
    u = rng.random(n)
    gaps = np.where(u < 0.14, 0.0, np.where(u < 0.74, rng.exponential(1.0, n), rng.exponential(25.0, n)))
    piece_of = np.repeat(np.arange(len(pieces)), counts)
    cum = np.cumsum(gaps)
    ends = np.cumsum(counts)
    before = np.concatenate(([0.0], cum[ends[:-1] - 1]))
    local = cum - before[piece_of]
    totals = local[ends - 1] + rng.exponential(25.0, len(pieces))
    starts = np.array([s for s, _, _ in pieces], dtype=np.int64)
    durations = np.array([d for _, d, _ in pieces], dtype=np.float64)
    offset = np.floor(local * (durations / totals)[piece_of]).astype(np.int64)
    return starts[piece_of] + offset


def _framed_dtype(code: bytes) -> np.dtype:
    return np.dtype([("length", ">u2")] + itch.message_dtype(code).descr)


_FRAMED = {code: _framed_dtype(code) for code in (b"A", b"F", b"E", b"C", b"X", b"D", b"U", b"P")}


class SyntheticDay:
    """Iterates the framed bytes of a synthetic day chunk by chunk: ``for frames, count in day.chunks()``."""

    def __init__(self, config: SynthConfig) -> None:
        if config.mix not in MIXES:
            raise SynthError(f"unknown mix {config.mix!r}: use one of {', '.join(MIXES)}")
        if config.orders_per_symbol < 1 or config.chunk_messages < 1024:
            raise SynthError("orders_per_symbol must be >= 1 and chunk_messages >= 1024")
        if config.symbols is not None and not 1 <= config.symbols <= MAX_SYMBOLS:
            raise SynthError(f"symbols must be within 1..{MAX_SYMBOLS} (stock locates are 16-bit)")
        self.config = config
        self.fixed = fixed_message_count(config)
        if config.messages < self.fixed:
            raise SynthError(
                f"{config.messages} messages is too few for {config.symbol_count()} symbols: the day's system "
                f"events, directory, NOII and crosses alone take {self.fixed}"
            )
        self.flow = config.messages - self.fixed
        self._rng = np.random.default_rng(config.seed)
        self.universe = _Universe(self._rng, config.symbol_count())
        self._book = _Book(self.universe.count, config.orders_per_symbol)
        self._next_ref = 1
        self._next_match = 1
        kinds = list(MIXES[config.mix])
        weights = np.array([MIXES[config.mix][k] for k in kinds])
        self._kind_codes = np.frombuffer(b"".join(kinds), dtype=np.uint8)
        self._kind_p = weights / weights.sum()

    # ---- scheduled (non order-flow) messages ------------------------------------------------------------

    def _scheduled(self) -> list[_Scheduled]:
        u = self.universe
        rng = self._rng
        out: list[_Scheduled] = []

        def event(ts: int, code: bytes) -> None:
            out.append(_Scheduled(ts, itch.SystemEvent(0, 0, ts, code)))

        ts = START_OF_MESSAGES_NS
        event(ts, b"O")
        out.append(_Scheduled(ts + 1, itch.MwcbDeclineLevel(0, 0, ts + 1, 3_000 * 10**8, 2_800 * 10**8, 2_500 * 10**8)))
        for i in range(u.count):
            locate, stock, t = i + 1, bytes(u.names[i]), ts + 1_000 + i * 1_000
            out.append(_Scheduled(t, itch.StockDirectory(
                locate, 0, t, stock, b"Q", b"N", ROUND_LOT, b"N", b"C", b"Z ", b"P", b"N", b" ", b"2", b"N", 0, b"N"
            )))
            out.append(_Scheduled(t + 1, itch.StockTradingAction(locate, 0, t + 1, stock, b"T", b" ", b"    ")))
        directory_end = ts + 1_000 + u.count * 1_000
        for j, i in enumerate(rng.choice(u.count, _reg_sho_count(u.count), replace=False)):
            t = directory_end + 1_000 + j
            out.append(_Scheduled(t, itch.RegShoRestriction(int(i) + 1, 0, t, bytes(u.names[i]), b"0")))
        for j, i in enumerate(rng.choice(u.count, _participant_count(u.count), replace=False)):
            t = directory_end + 2_000_000 + j
            mpid = bytes(_MPIDS[j % _MPIDS.size])
            out.append(_Scheduled(t, itch.MarketParticipantPosition(
                int(i) + 1, 0, t, mpid, bytes(u.names[i]), b"Y", b"N", b"A"
            )))
        event(START_OF_SYSTEM_HOURS_NS, b"S")

        noii_symbols = rng.choice(u.count, self.config.noii_symbol_count(), replace=False)
        windows = (
            (_noii_times(OPENING_NOII_START_NS, OPEN_NS, OPENING_NOII_INTERVAL_NS), b"O"),
            (_noii_times(CLOSING_NOII_START_NS, CLOSE_NS, CLOSING_NOII_INTERVAL_NS), b"C"),
        )
        for times, cross in windows:
            for t0 in times:
                for j, i in enumerate(noii_symbols):
                    t = int(t0) + j * 100
                    mid = int(u.mid[i])
                    paired = int(rng.integers(1, 500)) * ROUND_LOT
                    imbalance = int(rng.integers(0, 200)) * ROUND_LOT
                    direction = (b"B", b"S", b"N")[int(rng.integers(3))] if imbalance else b"N"
                    out.append(_Scheduled(t, itch.Noii(
                        int(i) + 1, 0, t, paired, imbalance, direction, bytes(u.names[i]),
                        mid, mid, mid, cross, b" ",
                    )))
        for t_cross, code, cross in ((OPEN_NS, b"Q", b"O"), (CLOSE_NS, b"M", b"C")):
            event(t_cross, code)
            for i in range(u.count):
                t = t_cross + 50_000 + i * 10
                shares = int(rng.integers(1, 1_000)) * ROUND_LOT
                out.append(_Scheduled(t, itch.CrossTrade(
                    i + 1, 0, t, shares, bytes(u.names[i]), int(u.mid[i]), 0, cross,
                )))
        event(END_OF_SYSTEM_HOURS_NS, b"E")
        event(END_OF_MESSAGES_NS, b"C")
        out.sort(key=lambda s: s.timestamp)  # stable: equal timestamps keep their insertion order
        assert len(out) == self.fixed
        return out

    # ---- chunks ------------------------------------------------------------------------------------------

    def chunks(self) -> Iterator[tuple[np.ndarray, int]]:
        """(framed bytes as uint8, message count) per chunk, in file order."""
        scheduled = self._scheduled()
        next_scheduled = 0
        pending: list[tuple[int, int, int]] = []
        pending_count = 0
        # modifications pick distinct live slots, so a chunk must stay below the number of slots
        target = min(self.config.chunk_messages, max(256, self._book.live.size))
        for piece in _order_flow_pieces(self._rng, self.flow, target):
            pending.append(piece)
            pending_count += piece[2]
            if pending_count >= target:
                end_ts = pending[-1][0] + pending[-1][1]
                take = next_scheduled
                while take < len(scheduled) and scheduled[take].timestamp < end_ts:
                    take += 1
                yield self._chunk(pending, scheduled[next_scheduled:take])
                next_scheduled = take
                pending, pending_count = [], 0
        if pending or next_scheduled < len(scheduled):
            yield self._chunk(pending, scheduled[next_scheduled:])

    def _chunk(self, pieces: list[tuple[int, int, int]], scheduled: list[_Scheduled]) -> tuple[np.ndarray, int]:
        rng = self._rng
        flow_ts = _flow_timestamps(rng, pieces) if pieces else np.empty(0, np.int64)
        flow_kinds = self._kind_codes[rng.choice(self._kind_codes.size, flow_ts.size, p=self._kind_p)]
        # scheduled messages first on equal timestamps (S/Q precedes the first order of 09:30:00.000000000)
        sched_ts = np.array([s.timestamp for s in scheduled], dtype=np.int64)
        sched_kinds = np.array([ord(itch.message_type(s.message)) for s in scheduled], dtype=np.uint8)
        ts = np.concatenate((sched_ts, flow_ts))
        order = np.argsort(ts, kind="stable")
        ts = ts[order]
        is_flow = order >= len(scheduled)
        kinds = np.concatenate((sched_kinds, flow_kinds))[order]
        flow_pos = np.flatnonzero(is_flow)
        sched_pos = np.flatnonzero(~is_flow)
        sched_index = order[sched_pos]

        fields = self._decide_flow(kinds, flow_pos)  # may rewrite kinds of flow positions
        # unique, increasing match numbers in file order across E, C, P and Q
        needs_match = np.isin(kinds, np.frombuffer(b"ECPQ", dtype=np.uint8))
        match = self._next_match + np.cumsum(needs_match) - 1
        self._next_match += int(needs_match.sum())

        frame_len = itch.LENGTH_BY_TYPE_BYTE[kinds] + LENGTH_PREFIX_SIZE
        offsets = np.concatenate(([0], np.cumsum(frame_len)[:-1]))
        out = np.zeros(int(frame_len.sum()), dtype=np.uint8)
        for code, pos_fields in fields.items():
            pos, values = pos_fields
            self._scatter(out, offsets, ts, match, code, pos, values)
        for pos, index in zip(sched_pos.tolist(), sched_index.tolist(), strict=True):
            message = scheduled[index].message
            if isinstance(message, itch.CrossTrade):
                message = message._replace(match_number=int(match[pos]))
            raw = itch.encode(message)
            start = int(offsets[pos])
            out[start : start + LENGTH_PREFIX_SIZE] = (len(raw) >> 8, len(raw) & 0xFF)
            out[start + LENGTH_PREFIX_SIZE : start + LENGTH_PREFIX_SIZE + len(raw)] = np.frombuffer(raw, np.uint8)
        return out, int(kinds.size)

    def _decide_flow(self, kinds: np.ndarray, flow_pos: np.ndarray) -> dict[bytes, tuple[np.ndarray, dict]]:
        """Pick the order (slot) of every flow event, update the book, and return per-type field columns."""
        rng = self._rng
        book = self._book
        u = self.universe
        k_per = book.per_symbol
        flow_kinds = kinds[flow_pos]
        is_mod = np.isin(flow_kinds, np.frombuffer(b"".join(_MODIFY_KINDS), np.uint8))
        live = np.flatnonzero(book.live)
        mod_idx = np.flatnonzero(is_mod)
        if mod_idx.size > live.size:  # not enough live orders (early in the day): those become adds
            demote = rng.choice(mod_idx, mod_idx.size - live.size, replace=False)
            flow_kinds[demote] = ord("A")
            is_mod[demote] = False
            mod_idx = np.flatnonzero(is_mod)
        mod_slots = rng.choice(live, mod_idx.size, replace=False) if mod_idx.size else np.empty(0, np.int64)

        # adds: symbol by popularity, any of its slots. A slot already touched in this chunk is fine: the
        # touch latest in file order decides the slot's state (see _settle), the others' orders rest untracked.
        add_idx = np.flatnonzero(np.isin(flow_kinds, np.frombuffer(b"AF", np.uint8)))
        add_sym = rng.choice(u.count, add_idx.size, p=u.popularity)
        add_slots = add_sym * k_per + rng.integers(0, k_per, add_idx.size)

        # X on a one-share order cannot be partial: delete it instead
        x_sel = flow_kinds[mod_idx] == ord("X")
        one_share = x_sel & (book.shares[mod_slots] < 2)
        flow_kinds[mod_idx[one_share]] = ord("D")
        kinds[flow_pos] = flow_kinds

        # new order references, increasing in file order (A, F and U's new reference)
        new_ref = np.isin(flow_kinds, np.frombuffer(b"AFU", np.uint8))
        refs = self._next_ref + np.cumsum(new_ref) - 1
        self._next_ref += int(new_ref.sum())

        fields: dict[bytes, tuple[np.ndarray, dict]] = {}
        touches: list[tuple[np.ndarray, ...]] = []  # (slot, position, live, ref, sell, price, shares)
        # -- adds
        if add_idx.size:
            sym = add_sym
            sell = rng.random(add_idx.size) < 0.5
            price = self._price(sym, sell)
            shares = self._shares(add_idx.size)
            new = refs[add_idx].astype(np.uint64)
            touches.append((add_slots, add_idx, np.ones(add_idx.size, bool), new, sell, price, shares))
            is_f = flow_kinds[add_idx] == ord("F")
            for code, sel in ((b"A", ~is_f), (b"F", is_f)):
                if sel.any():
                    cols: dict[str, np.ndarray] = {
                        "stock_locate": sym[sel] + 1, "order_ref": new[sel],
                        "side": np.where(sell[sel], b"S", b"B"), "shares": shares[sel],
                        "stock": u.names[sym[sel]], "price": price[sel],
                    }
                    if code == b"F":
                        cols["attribution"] = _MPIDS[rng.integers(0, _MPIDS.size, int(sel.sum()))]
                    fields[code] = (flow_pos[add_idx[sel]], cols)
        # -- modifications of live orders; each reads its slot as it was at the start of the chunk
        if mod_idx.size:
            mk = flow_kinds[mod_idx]
            for code in _MODIFY_KINDS:
                sel = mk == code[0]
                if not sel.any():
                    continue
                s_slots = mod_slots[sel]
                s_sym = s_slots // k_per
                s_old = book.ref[s_slots]
                s_rem = book.shares[s_slots]
                s_sell = book.sell[s_slots]
                s_price = book.price[s_slots]
                s_idx = mod_idx[sel]
                n = s_slots.size
                cols = {"stock_locate": s_sym + 1, "order_ref": s_old}
                if code == b"D":
                    after = (np.zeros(n, bool), s_old, s_sell, s_price, np.zeros(n, np.int64))
                elif code == b"U":
                    price = self._price(s_sym, s_sell)
                    shares = self._shares(n)
                    new = refs[s_idx].astype(np.uint64)
                    after = (np.ones(n, bool), new, s_sell, price, shares)
                    cols = {"stock_locate": s_sym + 1, "original_order_ref": s_old, "new_order_ref": new,
                            "shares": shares, "price": price}
                elif code == b"X":
                    cancelled = 1 + np.floor(rng.random(n) * (s_rem - 1)).astype(np.int64)
                    after = (np.ones(n, bool), s_old, s_sell, s_price, s_rem - cancelled)
                    cols["cancelled_shares"] = cancelled
                else:  # E, C: execute part or all of the remaining shares
                    executed = np.minimum(s_rem, ROUND_LOT * rng.integers(1, 4, n))
                    left = s_rem - executed
                    after = (left > 0, s_old, s_sell, s_price, left)
                    cols["executed_shares"] = executed
                    if code == b"C":
                        cols["printable"] = np.where(rng.random(n) < 0.9, b"Y", b"N")
                        cols["execution_price"] = s_price
                touches.append((s_slots, s_idx, *after))
                fields[code] = (flow_pos[s_idx], cols)
        if touches:
            self._settle(touches)
        # -- non-displayed trades
        p_idx = np.flatnonzero(flow_kinds == ord("P"))
        if p_idx.size:
            sym = rng.choice(u.count, p_idx.size, p=u.popularity)
            fields[b"P"] = (flow_pos[p_idx], {
                "stock_locate": sym + 1, "order_ref": np.zeros(p_idx.size, np.uint64),
                "side": np.where(rng.random(p_idx.size) < 0.5, b"B", b"S"),
                "shares": self._shares(p_idx.size), "stock": u.names[sym], "price": u.mid[sym],
            })
        return fields

    def _settle(self, touches: list[tuple[np.ndarray, ...]]) -> None:
        """Apply the chunk's slot updates: per slot, the touch latest in file order wins."""
        slot, pos, live, ref, sell, price, shares = (np.concatenate(column) for column in zip(*touches, strict=True))
        order = np.lexsort((pos, slot))
        ordered = slot[order]
        last = np.ones(order.size, dtype=bool)
        last[:-1] = ordered[1:] != ordered[:-1]
        win = order[last]
        book = self._book
        target = slot[win]
        book.live[target] = live[win]
        book.ref[target] = ref[win]
        book.sell[target] = sell[win]
        book.price[target] = price[win]
        book.shares[target] = shares[win]

    def _price(self, sym: np.ndarray, sell: np.ndarray) -> np.ndarray:
        """A resting price at least one tick from the symbol's reference, on its side: books never cross."""
        ticks = 1 + self._rng.geometric(0.25, sym.size)
        mid = self.universe.mid[sym]
        bid = np.maximum(mid - ticks * PRICE_TICK, PRICE_TICK)
        return np.where(sell, mid + ticks * PRICE_TICK, np.minimum(bid, mid - PRICE_TICK))

    def _shares(self, n: int) -> np.ndarray:
        lots = self._rng.geometric(0.45, n)
        odd = self._rng.random(n) < 0.08
        return np.where(odd, self._rng.integers(1, ROUND_LOT, n), lots * ROUND_LOT).astype(np.int64)

    @staticmethod
    def _scatter(out: np.ndarray, offsets: np.ndarray, ts: np.ndarray, match: np.ndarray, code: bytes,
                 pos: np.ndarray, cols: dict[str, np.ndarray]) -> None:
        dtype = _FRAMED[code]
        rows = np.zeros(pos.size, dtype=dtype)
        rows["length"] = dtype.itemsize - LENGTH_PREFIX_SIZE
        rows["type"] = code
        t = ts[pos].astype(np.uint64)
        rows["timestamp_high"] = t >> np.uint64(32)
        rows["timestamp_low"] = t & np.uint64(0xFFFFFFFF)
        if "match_number" in (dtype.names or ()):  # a structured dtype: names is never None
            rows["match_number"] = match[pos]
        for name, values in cols.items():
            rows[name] = values
        raw = rows.view(np.uint8).reshape(pos.size, dtype.itemsize)
        out[offsets[pos][:, None] + np.arange(dtype.itemsize)] = raw


def write_day(config: SynthConfig, path: str | os.PathLike[str], *, progress: bool | None = None) -> int:
    """Write a synthetic day to ``path``; returns the message count. ``progress``: None = when stderr is a tty.

    The configuration is checked before any file is created; the day is written under a temporary name and
    renamed to ``path`` once complete, so an interrupted run leaves no partial day behind.
    """
    from tqdm import tqdm

    day = SyntheticDay(config)
    show = sys.stderr.isatty() if progress is None else progress
    written = 0
    with DayFileWriter(path) as writer, tqdm(
        total=config.messages, unit="msg", unit_scale=True, file=sys.stderr, disable=not show, desc="synth"
    ) as bar:
        for frames, count in day.chunks():
            writer.write_frames(frames, count)
            written += count
            bar.update(count)
    return written
