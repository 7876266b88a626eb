"""A cnc.dat our driver writes for the vector's scenario (IPC publication and subscriptions, a UDP
publication and subscription on loopback, each client its own connection) follows aeronmd's rules field by
field: every counter's type, key, label and registration / owner / reference ids obey the same rules in both
files, counters of one entity are allocated in the same order, and the responses come in Aeron's order.
Values that differ by nature (pids, times, session ids, positions, ports, ids handed out) are not compared."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest
from aeron_vectors import read_vector

import logbuf
from logbuf.cnc import counters as c
from logbuf.cnc.cnc_file import CncFile
from logbuf.cnc.messages import ControlResponse
from logbuf.directory import CNC_FILE
from logbuf.driver.log_metadata import os_default_socket_buffers
from logbuf.samples.ports import free_udp_ports
from support import wait_until

STREAM_TYPES = {t: name for t, name in c.STREAM_COUNTER_NAMES.items()}
CHANNEL_STATUS_NAMES = {c.SEND_CHANNEL_STATUS_TYPE_ID: c.SEND_CHANNEL_STATUS_NAME,
                        c.RECEIVE_CHANNEL_STATUS_TYPE_ID: c.RECEIVE_CHANNEL_STATUS_NAME}
SOCKADDR_NAMES = {c.SEND_CHANNEL_STATUS_TYPE_ID: c.SEND_LOCAL_SOCKADDR_NAME,
                  c.RECEIVE_CHANNEL_STATUS_TYPE_ID: c.RECEIVE_LOCAL_SOCKADDR_NAME}


class Counter(NamedTuple):
    id: int
    type_id: int
    label: str
    key: bytes
    registration_id: int
    owner_id: int
    reference_id: int


def allocated(path: Path) -> list[Counter]:
    with CncFile.open(path) as cnc:
        r = cnc.counters_reader()
        return [Counter(i.counter_id, i.type_id, i.label, i.key, i.registration_id, i.owner_id, i.reference_id)
                for i in r]


def check_rules(counters: list[Counter]) -> None:
    """Aeron's rules for every counter of a cnc.dat (asserted on aeronmd's file and on ours alike)."""
    by_id = {k.id: k for k in counters}
    clients = {k.registration_id for k in counters if k.type_id == c.CLIENT_HEARTBEAT_TYPE_ID}
    for k in counters:
        where = f"counter {k.id} {k.label!r}"
        if k.type_id == c.SYSTEM_COUNTER_TYPE_ID:
            assert k.key[:4] == struct.pack("<i", k.id) and not any(k.key[4:]), where
            assert (k.registration_id, k.owner_id, k.reference_id) == (0, 0, 0), where
        elif k.type_id == c.CLIENT_HEARTBEAT_TYPE_ID:
            assert k.key[:8] == struct.pack("<q", k.registration_id) and k.owner_id == k.registration_id, where
            head = f"client-heartbeat: id={k.registration_id}"
            assert k.label == head or k.label.startswith(head + " name="), where  # the client completes it
        elif k.type_id in STREAM_TYPES:
            registration_id, session_id, stream_id, channel = c.decode_stream_position_key(k.key)
            assert registration_id == k.registration_id, where
            head = f"{STREAM_TYPES[k.type_id]}: {registration_id} {session_id} {stream_id} {channel} "
            if k.type_id == c.SUBSCRIBER_POSITION_TYPE_ID:
                assert k.label.startswith(head + "@") and k.label[len(head) + 1:].isdigit(), where
                assert k.owner_id in clients, where
                readable = {p.registration_id for p in counters if p.type_id in (
                    c.PUBLISHER_POSITION_TYPE_ID, c.RECEIVER_HWM_TYPE_ID) and
                    c.decode_stream_position_key(p.key)[1] == session_id}
                assert k.reference_id in readable, where
            else:
                assert k.label == head, where  # an empty suffix: Aeron's trailing space
                owner = k.owner_id in clients if k.type_id == c.PUBLISHER_LIMIT_TYPE_ID else k.owner_id == 0
                assert owner and k.reference_id == 0, where
        elif k.type_id in CHANNEL_STATUS_NAMES:
            (length,) = struct.unpack_from("<i", k.key, 0)
            channel = k.key[4 : 4 + length].decode()
            assert k.label.startswith(f"{CHANNEL_STATUS_NAMES[k.type_id]}: {channel} "), where
            address = k.label.rsplit(" ", 1)[1]
            sockaddr = by_id[k.id + 1]  # allocated right after its channel status counter
            assert sockaddr.type_id == c.LOCAL_SOCKADDR_TYPE_ID, where
            status_id, address_length = struct.unpack_from("<ii", sockaddr.key, 0)
            assert (status_id, sockaddr.key[8 : 8 + address_length].decode()) == (k.id, address), where
            assert sockaddr.label == f"{SOCKADDR_NAMES[k.type_id]}: {k.id} {address}", where
            assert sockaddr.registration_id == k.registration_id and sockaddr.owner_id == k.owner_id == 0, where


def contains(counters: list[Counter], types: tuple[int, ...]) -> bool:
    """Whether counters of these types were allocated one after the other (one entity's counters)."""
    sequence = [k.type_id for k in counters]
    return any(tuple(sequence[i : i + len(types)]) == types for i in range(len(sequence)))


def broadcast_records(path: Path) -> Iterator[tuple[int, bytes]]:
    """(type, body) of every record still in the to-clients buffer, from its start."""
    with CncFile.open(path) as cnc:
        buffer = cnc.to_clients_buffer
        capacity = buffer.capacity - 128
        tail = buffer.get_i64(capacity + 8)
        data = buffer.get_bytes(0, min(tail, capacity))
    offset = 0
    while offset + 8 <= len(data):
        length, msg_type = struct.unpack_from("<ii", data, offset)
        if length <= 0:
            break
        yield msg_type, data[offset + 8 : offset + length]
        offset += (length + 7) & -8


META_LENGTH = 4096
META_FLAGS = slice(448, 496)  # entity tag, response correlation id, linger and untethered timeouts, flags
META_WINDOWS = slice(284, 292)  # publication window, receiver window
SPARSE = 492


def log_metadata_bytes(data: bytes) -> bytes:
    return data[len(data) - META_LENGTH :]


def log_metadata(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-META_LENGTH, 2)
        return f.read()


@pytest.fixture
def aeron_counters(tmp_path: Path) -> list[Counter]:
    path = tmp_path / "aeron-cnc.dat"
    path.write_bytes(read_vector("cnc/cnc.dat.gz"))
    return allocated(path)


def test_aeron_s_cnc_obeys_the_rules(aeron_counters: list[Counter]) -> None:
    """The oracle: the rules hold for aeronmd's own file (minus the spy subscription, which logbuf has not)."""
    check_rules(aeron_counters)


def test_our_driver_s_cnc_follows_aeron_s(tmp_path: Path, aeron_counters: list[Counter]) -> None:
    udp = f"aeron:udp?endpoint=127.0.0.1:{free_udp_ports(1)[0]}"
    # the vectors' driver settings: 64 KiB terms for IPC and UDP
    with logbuf.MediaDriver.launch(tmp_path / "drv", idle_strategy="backoff:200000", ipc_term_length=65536,
                                   network_term_length=65536) as driver, \
            logbuf.connect(driver.directory) as rate_subscriber, logbuf.connect(driver.directory) as ipc_subscriber, \
            logbuf.connect(driver.directory) as ipc_publisher, logbuf.connect(driver.directory) as udp_publisher:
        udp_sub = rate_subscriber.add_subscription(udp, 2004)
        ipc_sub = ipc_subscriber.add_subscription("aeron:ipc", 2001)
        ipc_pub = ipc_publisher.add_publication("aeron:ipc", 2001)
        udp_pub = udp_publisher.add_publication(udp, 2004)
        wait_until(lambda: ipc_pub.is_connected and udp_pub.is_connected and udp_sub.images and ipc_sub.images,
                   what="every publication connected and every subscription with its image")
        path = Path(driver.directory) / CNC_FILE
        ours = allocated(path)
        records = list(broadcast_records(path))
        logs = {
            "ipc-during-linger": Path(driver.directory) / "publications" / f"{ipc_pub.registration_id}.logbuffer",
            "udp-pub-during-linger": Path(driver.directory) / "publications" / f"{udp_pub.registration_id}.logbuffer",
            "udp-image-during-linger": next((Path(driver.directory) / "images").glob("*.logbuffer")),
        }
        metadata = {name: log_metadata(path) for name, path in logs.items()}

    # log metadata: the fields after the default header (entity tag .. tether) and the windows as aeronmd's
    for name, ours_meta in metadata.items():
        theirs = log_metadata_bytes(read_vector(f"logbuffers/{name}.logbuffer"))
        # the sparse flag says what each driver made: logbuf's logs are sparse by default, aeronmd's are not
        assert ours_meta[SPARSE] == 1 and theirs[SPARSE] == 0, name
        ours_flags, theirs_flags = bytearray(ours_meta[META_FLAGS]), bytearray(theirs[META_FLAGS])
        ours_flags[SPARSE - META_FLAGS.start] = theirs_flags[SPARSE - META_FLAGS.start] = 0
        assert ours_flags == theirs_flags, name
        assert ours_meta[META_WINDOWS] == theirs[META_WINDOWS], name
        sndbuf, rcvbuf = struct.unpack_from("<ii", ours_meta, 296)[0], struct.unpack_from("<i", ours_meta, 308)[0]
        assert (sndbuf, rcvbuf) == os_default_socket_buffers(), name  # the OS's, as aeronmd records them

    check_rules(ours)
    by_type = {k.type_id for k in ours}
    assert by_type == {k.type_id for k in aeron_counters}  # every kind of counter aeronmd had, and no other
    # one entity's counters in aeronmd's order: UDP publication, receive endpoint, image, IPC publication
    for entity in ((6, 14, 12, 1, 2, 9, 13), (7, 14), (3, 5, 4), (12, 1)):
        assert contains(aeron_counters, entity) and contains(ours, entity), entity
    # sub-pos: keyed and labelled by its subscription, owned by its client, referring to what it reads
    sub_pos = {k.registration_id: k for k in ours if k.type_id == c.SUBSCRIBER_POSITION_TYPE_ID}
    assert sub_pos[ipc_sub.registration_id].reference_id == ipc_pub.registration_id
    assert sub_pos[ipc_sub.registration_id].owner_id == ipc_subscriber.client_id
    assert sub_pos[udp_sub.registration_id].owner_id == rate_subscriber.client_id
    assert sub_pos[udp_sub.registration_id].label.split()[4] == udp
    pub_lmt = {k.registration_id: k.owner_id for k in ours if k.type_id == c.PUBLISHER_LIMIT_TYPE_ID}
    assert pub_lmt == {ipc_pub.registration_id: ipc_publisher.client_id,
                       udp_pub.registration_id: udp_publisher.client_id}
    # responses: each client's heartbeat counter announced; an IPC publication's READY before its image
    counter_ready = [struct.unpack_from("<qi", body) for t, body in records if t == ControlResponse.ON_COUNTER_READY]
    heartbeats = {k.registration_id: k.id for k in ours if k.type_id == c.CLIENT_HEARTBEAT_TYPE_ID}
    assert dict(counter_ready) == heartbeats
    kinds = [t for t, body in records if struct.unpack_from("<q", body)[0] == ipc_pub.registration_id]
    assert kinds.index(ControlResponse.ON_PUBLICATION_READY) < kinds.index(ControlResponse.ON_AVAILABLE_IMAGE)
