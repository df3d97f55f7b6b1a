// A stand-in daemon for testkit's own tests: serves sandnode.common.v1.VersionService/GetVersion
// (an empty GetVersionResponse) on the unix socket FAKE_DAEMON_SOCKET after FAKE_DAEMON_DELAY_MS,
// prints FAKE_DAEMON_SAY to stdout, exits FAKE_DAEMON_EXIT at once when that is set, and exits 0 on SIGTERM
// unless FAKE_DAEMON_IGNORE_TERM is set.
const env = process.env;
if (env.FAKE_DAEMON_SAY) process.stdout.write(`${env.FAKE_DAEMON_SAY}\n`);
if (env.FAKE_DAEMON_EXIT) process.exit(Number(env.FAKE_DAEMON_EXIT));
const grpc = require('@grpc/grpc-js');
const server = new grpc.Server();
const raw = { serialize: (b) => b, deserialize: (b) => b };
server.addService(
  {
    getVersion: {
      path: '/sandnode.common.v1.VersionService/GetVersion',
      requestStream: false,
      responseStream: false,
      requestSerialize: raw.serialize,
      requestDeserialize: raw.deserialize,
      responseSerialize: raw.serialize,
      responseDeserialize: raw.deserialize,
    },
  },
  { getVersion: (_call, cb) => cb(null, Buffer.alloc(0)) },
);
process.on('SIGTERM', () => {
  if (env.FAKE_DAEMON_IGNORE_TERM) return;
  server.forceShutdown();
  process.exit(0);
});
setTimeout(
  () => {
    server.bindAsync(`unix://${env.FAKE_DAEMON_SOCKET}`, grpc.ServerCredentials.createInsecure(), (err) => {
      if (err) {
        process.stderr.write(`bind: ${err.message}\n`);
        process.exit(1);
      }
      process.stderr.write('fake daemon ready\n');
    });
  },
  Number(env.FAKE_DAEMON_DELAY_MS ?? 0),
);
