"""A read-only Kafka-protocol listener (see #42): each compacted topic served to any Kafka client as its ledger up
to the horizon, with the topic's own offsets, then as the live log, relayed from the broker.

``protocol`` decodes and encodes frames (kafka-python's protocol classes), ``fetch_frames`` the Fetch answers
(each relayed record set as the broker sent it), ``batches`` turns ledger entries into record batches, ``view`` reads the daemon's topics and ledgers, ``relay`` reaches the real broker, ``handlers``
answers Metadata, ListOffsets and Fetch, ``groups`` relays the consumer groups' requests to their coordinator,
``auth`` takes SASL/PLAIN on SASL listeners, ``server`` runs the TCP servers (TLS on SSL ones) in a thread of
their own.
"""

from __future__ import annotations

from compactord.listener.server import KafkaListener

__all__ = ["KafkaListener"]
