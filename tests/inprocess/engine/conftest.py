"""The reader backends (``compactionReaderClient``): the engine suite runs on the default one (``auto``:
librdkafka, confluent-kafka being a dependency); the tests that take ``reader_client`` run on kafka-python
too (codecs, transactions, cancel, reads out of the log's range), so that neither backend rots while CI
pays for only a few more runs."""

from __future__ import annotations

import pytest

READER_CLIENTS = ("auto", "kafka-python")


@pytest.fixture(params=READER_CLIENTS)
def reader_client(request: pytest.FixtureRequest) -> str:
    return request.param
