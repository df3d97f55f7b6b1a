/**
 * Attack (issue 10 §5): 500 Exec streams straight on podd's socket (a hostile caller that
 * reached it, past the server's per-sandbox cap) made podd run out of file descriptors. The real
 * podd (dist/main.js on the host), its open-file limit lowered to the sandbox's 1024 with
 * prlimit: the streams above its cap are RESOURCE_EXHAUSTED before anything is spawned, the
 * others run, Health answers during the flood, and podd runs a new command once the flood ends.
 */
import { execFileSync } from 'node:child_process';
import path from 'node:path';
import { ClientError, createChannel, Status } from 'nice-grpc';
import type { Channel } from 'nice-grpc';
import { createServiceClient } from '@sandnode/shared';
import { PoddServiceDefinition } from '@sandnode/shared/proto/podd/v1/podd';
import { built, describeWith, startDaemon, useTempDir, type RunningDaemon } from '@sandnode/testkit';

jest.setTimeout(120_000);

const MAIN = path.resolve(__dirname, '..', '..', 'dist', 'main.js');
const FLOOD = 500;
/** channels the flood uses (podd allows 256 streams per connection) */
const CHANNELS = 4;

describeWith('podd under an Exec flood (dist/main.js on the host)', [built('@sandnode/podd'), { name: 'prlimit (util-linux)', present: () => hasPrlimit(), ciProvides: true }], () => {
  const dir = useTempDir('podd-flood');
  let daemon: RunningDaemon;
  const channels: Channel[] = [];

  afterAll(async () => {
    for (const c of channels) c.close();
    await daemon?.stop();
  });

  it('500 Exec streams: the ones above the cap are RESOURCE_EXHAUSTED, the rest run, and podd keeps serving', async () => {
    const sock = path.join(dir(), 'podd.sock');
    daemon = await startDaemon({ main: MAIN, args: ['--socket', sock], socket: sock, logFile: path.join(dir(), 'podd.log'), env: { SANDNODE_PODD_LOG_LEVEL: 'warn' } });
    // the sandbox's limit (vmm-supervisor OCI spec: soft 1024)
    execFileSync('prlimit', ['--pid', String(daemon.pid), '--nofile=1024:1024']);
    const client = () => {
      // a connection of its own each (grpc-js shares one between equal channels by default)
      const ch = createChannel(daemon.address, undefined, { 'grpc.use_local_subchannel_pool': 1 });
      channels.push(ch);
      return createServiceClient(PoddServiceDefinition, ch, { timeoutMs: 60_000 });
    };
    const control = client();
    await control.health({});
    const flooders = Array.from({ length: CHANNELS }, () => client());
    const abort = new AbortController();
    let started = 0;
    const outcomes = await Promise.all(
      Array.from({ length: FLOOD }, async (_, i): Promise<string> => {
        try {
          for await (const ev of flooders[i % CHANNELS]!.exec({ argv: ['sleep', '60'], cwd: dir() }, { signal: abort.signal })) {
            if (ev.event?.$case === 'started') {
              started++;
              return 'started';
            }
          }
          return 'ended without started';
        } catch (err) {
          return err instanceof ClientError ? (err.code === Status.RESOURCE_EXHAUSTED ? Status[err.code] : `${Status[err.code]}: ${err.details}`) : String(err);
        }
      }),
    );
    const count = (s: string) => outcomes.filter((o) => o === s).length;
    // every call either runs or is refused: no EMFILE, no UNKNOWN, no dropped connection
    expect([...new Set(outcomes)].sort()).toEqual(['RESOURCE_EXHAUSTED', 'started']);
    expect(count('started') + count('RESOURCE_EXHAUSTED')).toBe(FLOOD);
    expect(count('RESOURCE_EXHAUSTED')).toBeGreaterThanOrEqual(FLOOD - 256);
    expect(started).toBeGreaterThan(0);
    // podd serves while the flood runs
    await expect(control.health({})).resolves.toBeDefined();
    abort.abort();
    // and runs a new command once it ended (the slots come back as the killed commands close)
    let out = '';
    for (let i = 0; i < 100 && !out; i++) {
      try {
        for await (const ev of control.exec({ argv: ['echo', 'still here'], cwd: dir() })) if (ev.event?.$case === 'stdout') out += Buffer.from(ev.event.value).toString();
      } catch (err) {
        if (!(err instanceof ClientError && err.code === Status.RESOURCE_EXHAUSTED)) throw err;
        await new Promise((r) => setTimeout(r, 100));
      }
    }
    expect(out).toBe('still here\n');
    expect(daemon.running()).toBe(true);
  });
});

function hasPrlimit(): boolean {
  try {
    execFileSync('prlimit', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}
