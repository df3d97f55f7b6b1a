/**
 * The CLI refuses, before the call, flags an older server would drop without a word (proto3
 * unknown fields): the idle flags, --env and the network policy flags against a server without
 * their features; FAILED_PRECONDITION naming the version, the features and the flags.
 */
import type { ServerApi } from '@sandnode/node-stack';
import { SERVER_FEATURES, Status } from '@sandnode/shared';
import { flagNeeds } from './commands/sandbox';
import { describeError } from './output';
import { requireServerFeatures } from './server-features';

/** a server of version answering features; asked counts its GetVersion calls */
function server(version: string, features: string[]) {
  const asked = { n: 0 };
  const api = { version: { getVersion: async () => (asked.n++, { version, features }) } } as unknown as ServerApi;
  return { api, asked };
}

const none = { allowOut: [], denyOut: [] };

describe('server features the CLI flags need', () => {
  it('flagNeeds: idle flags, --env and the policy flags each name their feature; --no-network and no flags need nothing', () => {
    expect(flagNeeds({ ...none }, false)).toEqual([]);
    expect(flagNeeds({ ...none, network: false }, false)).toEqual([]);
    expect(flagNeeds({ ...none, pauseAfterS: 5, autoResume: false, env: { A: '1' } }, false)).toEqual([
      { feature: SERVER_FEATURES.idle, what: '--pause-after-s' },
      { feature: SERVER_FEATURES.idle, what: '--no-auto-resume' },
      { feature: SERVER_FEATURES.sandboxEnv, what: '--env' },
    ]);
    expect(flagNeeds({ allowOut: ['example.com'], denyOut: [], public: true, pausedTtlS: 0 }, true)).toEqual([
      { feature: SERVER_FEATURES.forkIdle, what: '--paused-ttl-s' },
      { feature: SERVER_FEATURES.network, what: '--allow-out' },
      { feature: SERVER_FEATURES.network, what: '--public' },
    ]);
  });

  it('a server without the feature: FAILED_PRECONDITION naming version, feature and flags; with it, or with no needs, nothing is refused', async () => {
    const old = server('0.2.0', [SERVER_FEATURES.sandbox, SERVER_FEATURES.fork]);
    const err = await requireServerFeatures(old.api, flagNeeds({ ...none, pauseAfterS: 60, hibernateAfterS: 600, env: { A: '1' } }, false)).catch((e: unknown) => e);
    const r = describeError(err);
    expect(r).toMatchObject({ code: 'FAILED_PRECONDITION', grpcCode: Status.FAILED_PRECONDITION, exitCode: 1 });
    expect(r.message).toBe(
      'the server (0.2.0) lacks "server.idle.v1" (for --pause-after-s, --hibernate-after-s) and "server.sandbox-env.v1" (for --env): it would ignore them; nothing was done. Upgrade the server (sandnode upgrade server) or leave these flags out',
    );
    const now = server('0.3.0', Object.values(SERVER_FEATURES));
    await expect(requireServerFeatures(now.api, flagNeeds({ ...none, pauseAfterS: 60 }, false))).resolves.toBeUndefined();
    const idle = server('0.2.0', []);
    await expect(requireServerFeatures(idle.api, [])).resolves.toBeUndefined();
    expect(idle.asked.n).toBe(0);
  });
});
