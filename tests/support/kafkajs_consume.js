// A KafkaJS consumer in a group reads one partition's topic from the beginning to its end and commits its offset.
//
//   node kafkajs_consume.js BOOTSTRAP TOPIC GROUP
//
// KafkaJS is found through NODE_PATH (tests/daemon/test_listener_clients.py installs it with npm). It prints one
// JSON line per record ({"offset", "key", "value"}: base64, or null for a null key or value), then exits 0 once it
// has read up to the high watermark of a fetch and committed the offset after its last record (never past it).
// Any error: its message on stderr, exit 1.
"use strict";

const { Kafka, logLevel } = require("kafkajs");

const [bootstrap, topic, groupId] = process.argv.slice(2);

function encoded(buffer) {
  return buffer === null ? null : buffer.toString("base64");
}

async function main() {
  const kafka = new Kafka({ clientId: "kafkajs-test", brokers: [bootstrap], logLevel: logLevel.WARN });
  const consumer = kafka.consumer({ groupId, retry: { retries: 5 } });
  let finish;
  const done = new Promise((resolve) => { finish = resolve; });
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
        for (const message of batch.messages) {
          process.stdout.write(JSON.stringify({ offset: Number(message.offset), key: encoded(message.key),
                                                value: encoded(message.value) }) + "\n");
          resolveOffset(message.offset);
        }
        await heartbeat();
        const next = BigInt(batch.lastOffset()) + 1n;
        if (batch.messages.length > 0 && next >= BigInt(batch.highWatermark)) {
          await consumer.commitOffsets([{ topic, partition: batch.partition, offset: next.toString() }]);
          finish();
        }
      },
    });
    await done;
  } finally {
    await consumer.disconnect();
  }
}

main().catch((error) => {
  process.stderr.write(`${error.stack || error}\n`);
  process.exit(1);
});
