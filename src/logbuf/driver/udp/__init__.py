"""UDP network publications and images, sans-IO: pure state machines fed with frames and ``now_ns`` that
return what to send.  Sockets, threads and counters in cnc.dat are the driver's.

Sender side: :class:`PublicationSender` = :class:`SenderSchedule` + :class:`SendPlanner` + flow control
(:class:`UnicastFlowControl`, :class:`MinMulticastFlowControl`, :class:`TaggedFlowControl`)
+ :class:`RetransmitHandler`; a multi-destination-cast endpoint's :class:`DestinationTracker`.
Receiver side: :class:`ReceiverDispatcher` -> :class:`ImageReceiver` = :class:`TermRebuilder` +
:class:`LossDetector` + :class:`StatusMessageSchedule`.  :class:`Impairment` models a lossy network.
"""

from logbuf.driver.udp.counters import ReceiverCounters, SenderCounters
from logbuf.driver.udp.destination_tracker import DestinationTracker
from logbuf.driver.udp.flow_control import (
    FlowControl,
    MinMulticastFlowControl,
    TaggedFlowControl,
    UnicastFlowControl,
)
from logbuf.driver.udp.image_receiver import ImageReceiver, ImageState
from logbuf.driver.udp.impairment import Impairment
from logbuf.driver.udp.loss_detector import Gap, LossDetector, LossScan, MulticastNakDelay, UnicastNakDelay
from logbuf.driver.udp.publication_sender import Outgoing, OutgoingKind, PublicationSender
from logbuf.driver.udp.receiver_dispatcher import CreateImage, ImageRemoved, ReceiverDispatcher, Reply
from logbuf.driver.udp.retransmit import Resend, RetransmitHandler
from logbuf.driver.udp.send_planner import SendPlan, SendPlanner
from logbuf.driver.udp.sender_schedule import SenderSchedule
from logbuf.driver.udp.status_schedule import StatusMessageSchedule, receiver_window_length
from logbuf.driver.udp.term_rebuilder import TermRebuilder

__all__ = [
    "CreateImage",
    "DestinationTracker",
    "FlowControl",
    "Gap",
    "ImageReceiver",
    "ImageRemoved",
    "ImageState",
    "Impairment",
    "LossDetector",
    "LossScan",
    "MinMulticastFlowControl",
    "MulticastNakDelay",
    "Outgoing",
    "OutgoingKind",
    "PublicationSender",
    "ReceiverCounters",
    "ReceiverDispatcher",
    "Reply",
    "Resend",
    "RetransmitHandler",
    "SendPlan",
    "SendPlanner",
    "SenderCounters",
    "SenderSchedule",
    "StatusMessageSchedule",
    "TaggedFlowControl",
    "TermRebuilder",
    "UnicastFlowControl",
    "UnicastNakDelay",
    "receiver_window_length",
]
