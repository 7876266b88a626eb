"""Example subscriber (``logbuf book``): top of book per symbol from the feed handler's message stream.

Builds order books from ITCH 5.0 order messages (A/F add, E/C executed, X cancel, D delete, U replace) as
they arrive on the messages stream, and watches the events stream so a gap is reported, never papered over.
It is deliberately small: a reference for writing a logbuf subscriber, not a production book.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter as Tally
from dataclasses import dataclass, field

from logbuf.client.client import connect
from logbuf.feed import published as out
from logbuf.logbuffer.header import Header
from logbuf.marketdata import itch


@dataclass
class Book:
    bids: dict[int, int] = field(default_factory=dict)  # price -> shares
    asks: dict[int, int] = field(default_factory=dict)

    def best(self) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        bid = max(self.bids.items()) if self.bids else None
        ask = min(self.asks.items()) if self.asks else None
        return bid, ask


class TopOfBook:
    """Feed it ITCH messages in sequence order; ask for the best bid/offer of any symbol."""

    def __init__(self) -> None:
        self.symbols: dict[int, str] = {}  # stock locate -> symbol (from stock directory messages)
        self.books: dict[int, Book] = {}
        self.orders: dict[int, tuple[int, bool, int, int]] = {}  # ref -> (locate, is_buy, price, shares)
        self.activity: Tally[int] = Tally()
        self.last_sequence = 0

    def _add(self, locate: int, ref: int, is_buy: bool, price: int, shares: int) -> None:
        self.orders[ref] = (locate, is_buy, price, shares)
        book = self.books.setdefault(locate, Book())
        side = book.bids if is_buy else book.asks
        side[price] = side.get(price, 0) + shares
        self.activity[locate] += 1

    def _reduce(self, ref: int, shares: int | None) -> None:
        order = self.orders.get(ref)
        if order is None:
            return  # joined after it was added
        locate, is_buy, price, left = order
        take = left if shares is None else min(shares, left)
        book = self.books[locate]
        side = book.bids if is_buy else book.asks
        remaining = side.get(price, 0) - take
        if remaining > 0:
            side[price] = remaining
        else:
            side.pop(price, None)
        if left - take > 0:
            self.orders[ref] = (locate, is_buy, price, left - take)
        else:
            del self.orders[ref]
        self.activity[locate] += 1

    def on_message(self, message: bytes | memoryview, sequence: int) -> None:
        self.last_sequence = sequence
        kind = bytes(message[:1])
        if kind not in b"RAFECXDU":
            return
        msg = itch.decode(message)  # its class follows from the type byte
        if isinstance(msg, itch.StockDirectory):
            self.symbols[msg.stock_locate] = msg.stock.decode().rstrip()
        elif isinstance(msg, (itch.AddOrder, itch.AddOrderMpid)):
            self._add(msg.stock_locate, msg.order_ref, msg.side == b"B", msg.price, msg.shares)
        elif isinstance(msg, (itch.OrderExecuted, itch.OrderExecutedWithPrice)):
            self._reduce(msg.order_ref, msg.executed_shares)
        elif isinstance(msg, itch.OrderCancel):
            self._reduce(msg.order_ref, msg.cancelled_shares)
        elif isinstance(msg, itch.OrderDelete):
            self._reduce(msg.order_ref, None)
        elif isinstance(msg, itch.OrderReplace):
            order = self.orders.get(msg.original_order_ref)
            self._reduce(msg.original_order_ref, None)
            if order is not None:
                self._add(order[0], msg.new_order_ref, order[1], msg.price, msg.shares)

    def top(self, symbol_or_locate: str | int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
        locate = symbol_or_locate
        if isinstance(symbol_or_locate, str):
            matches = [k for k, v in self.symbols.items() if v == symbol_or_locate]
            if not matches:
                return None, None
            locate = matches[0]
        book = self.books.get(int(locate))
        return book.best() if book else (None, None)

    def format(self, symbols: list[str] | None = None, top_n: int = 5) -> str:
        if symbols is None:
            locates = [loc for loc, _ in self.activity.most_common(top_n)]
        else:
            locates = [k for s in symbols for k, v in self.symbols.items() if v == s]
        lines = [f"seq {self.last_sequence}  orders {len(self.orders)}"]
        for locate in locates:
            bid, ask = self.books.get(locate, Book()).best()
            name = self.symbols.get(locate, f"#{locate}")
            b = f"{bid[1]:>7} @ {bid[0] / 10_000:>10.4f}" if bid else f"{'-':>20}"
            a = f"{ask[0] / 10_000:<10.4f} x {ask[1]:<7}" if ask else "-"
            lines.append(f"  {name:<8} {b}  |  {a}")
        return "\n".join(lines)


def run_top_of_book(args: argparse.Namespace) -> int:
    symbols = args.symbols.split(",") if args.symbols else None
    book = TopOfBook()
    gaps: list[out.FeedEvent] = []
    with connect(args.dir) as client:
        messages = client.add_subscription(args.channel, args.stream)
        events = client.add_subscription(args.channel, args.events_stream)
        deadline = None if args.duration is None else time.monotonic() + args.duration
        next_print = time.monotonic() + args.interval
        on_message = book.on_message

        def handler(buffer: memoryview, header: Header) -> None:
            on_message(buffer, header.reserved_value)

        def on_event(buffer: memoryview, header: Header) -> None:
            event = out.FeedEvent.decode(buffer)
            if event.kind in (out.GAP_DETECTED, out.GAP_UNRECOVERABLE, out.GAP_RECOVERED):
                gaps.append(event)
                if args.verbose:
                    print(f"{event.name} [{event.first}, {event.last}]", file=sys.stderr)

        try:
            while deadline is None or time.monotonic() < deadline:
                work = messages.poll(handler, 1000) + events.poll(on_event, 10)
                if not work:
                    messages.wait(0.05)
                if time.monotonic() >= next_print:
                    next_print += args.interval
                    if not args.quiet:
                        print(book.format(symbols), flush=True)
        except KeyboardInterrupt:
            pass
    print(book.format(symbols), flush=True)  # the final book, with --quiet too (its one output)
    return 0
