// Drives the unmodified npm salesforce-pubsub-api-client against a Pub/Sub API server (the
// sfcdc emulator, started by tests/interop/test_npm_client.py) and prints what the client
// made of it, one JSON object per line on stdout. The client's own log goes to stderr.
//
// Input: the SFCDC_INTEROP environment variable, a JSON object:
//   endpoint       gRPC host:port
//   loginUrl       https origin of the OAuth endpoint (client credentials)
//   clientId, clientSecret
//   topic          change event topic to read from the earliest event
//   count          events to read there (at most 100: one request)
//   resumeIndex    which of those events' replay id the client stores and resumes after
//   resumeCount    events to read after it, with a new client
//   publishTopic, publishPayload   a platform event to publish (unions wrapped, as avro-js wants)
//   timeoutMs      per phase
//
// Phases, in order: "subscribe", "publish", "resume"; then "done". A failure prints
// {"phase": "error", ...} and exits 1.

import PubSubApiClient from 'salesforce-pubsub-api-client';

const cfg = JSON.parse(process.env.SFCDC_INTEROP ?? '{}');

function out(record) {
  process.stdout.write(
    JSON.stringify(record, (_key, value) => (typeof value === 'bigint' ? value.toString() : value)) +
      '\n',
  );
}

const logger = {
  debug: () => {},
  info: (...args) => console.error(...args),
  warn: (...args) => console.error(...args),
  error: (...args) => console.error(...args),
};

function newClient() {
  return new PubSubApiClient(
    {
      authType: 'oauth-client-credentials',
      loginUrl: cfg.loginUrl,
      clientId: cfg.clientId,
      clientSecret: cfg.clientSecret,
      pubSubEndpoint: cfg.endpoint,
      // The client verifies gRPC TLS against the root bundle it ships, which no local CA can
      // join; its HTTPS login trusts NODE_EXTRA_CA_CERTS (the emulator's CA) instead.
      rejectUnauthorizedSsl: false,
    },
    logger,
  );
}

// Resolves with the parsed events once the client reports the last requested one.
function collect(subscribe, count, label) {
  return new Promise((resolve, reject) => {
    const events = [];
    const timer = setTimeout(
      () => reject(new Error(`${label}: ${events.length} of ${count} events before the timeout`)),
      cfg.timeoutMs ?? 30000,
    );
    subscribe((_subscription, type, data) => {
      if (type === 'event') {
        events.push(data);
      } else if (type === 'lastEvent') {
        clearTimeout(timer);
        resolve(events);
      } else if (type === 'error') {
        clearTimeout(timer);
        reject(data);
      } else if (type === 'end' && events.length < count) {
        clearTimeout(timer);
        reject(new Error(`${label}: the stream ended after ${events.length} of ${count} events`));
      }
    });
  });
}

function describe(phase, event) {
  const header = event.payload.ChangeEventHeader ?? {};
  return {
    phase,
    id: event.id,
    schemaId: event.schemaId,
    replayId: String(event.replayId),
    changeType: header.changeType,
    recordIds: header.recordIds,
    changedFields: header.changedFields,
    nulledFields: header.nulledFields,
    diffFields: header.diffFields,
  };
}

async function main() {
  const client = newClient();
  await client.connect();

  const events = await collect(
    (callback) => client.subscribeFromEarliestEvent(cfg.topic, callback, cfg.count),
    cfg.count,
    'subscribe',
  );
  for (const event of events) {
    out(describe('subscribe', event));
  }

  const published = await client.publish(cfg.publishTopic, cfg.publishPayload);
  out({
    phase: 'publish',
    replayId: String(published.replayId),
    correlationKey: published.correlationKey,
  });
  client.close();

  // What an application does after a restart: resume after the replay id it stored, a number.
  const stored = events[cfg.resumeIndex].replayId;
  const resumed = newClient();
  await resumed.connect();
  const after = await collect(
    (callback) => resumed.subscribeFromReplayId(cfg.topic, callback, cfg.resumeCount, stored),
    cfg.resumeCount,
    'resume',
  );
  for (const event of after) {
    out({ ...describe('resume', event), storedReplayId: String(stored) });
  }
  resumed.close();
  out({ phase: 'done' });
}

main().then(
  () => process.exit(0),
  (error) => {
    out({
      phase: 'error',
      message: String(error?.message ?? error),
      code: error?.code,
      details: error?.details,
      cause: error?.cause ? String(error.cause.message ?? error.cause) : undefined,
    });
    process.exit(1);
  },
);
