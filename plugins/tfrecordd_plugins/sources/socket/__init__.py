"""Socket sources: ``tcp`` and ``unix`` stream sockets of framed events, and ``udp`` datagrams.
:mod:`.framing` splits a stream into frames and writes the replies, :mod:`.connection` serves
one client, :mod:`.server` the set of connections, :mod:`.config` holds the keys the stream
sources share and :mod:`.inet` the IP addresses; :mod:`.tcp`, :mod:`.unix` and :mod:`.udp` are
the sources, re-exported here for the ``tfrecordd.sources`` entry points.
"""

from tfrecordd_plugins.sources.socket.tcp import TcpSource, TcpSourceConfig
from tfrecordd_plugins.sources.socket.udp import UdpSource, UdpSourceConfig
from tfrecordd_plugins.sources.socket.unix import UnixSource, UnixSourceConfig

__all__ = [
    "TcpSource",
    "TcpSourceConfig",
    "UdpSource",
    "UdpSourceConfig",
    "UnixSource",
    "UnixSourceConfig",
]
