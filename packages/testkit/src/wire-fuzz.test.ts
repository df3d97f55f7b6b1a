import { seededRandom } from './fuzz-random';
import { loadRpcs, MUTATIONS, mutate, seedMessage, varint, type MutationKind } from './wire-fuzz';

describe('wire fuzz engine', () => {
  const rpcs = loadRpcs();

  it('lists every RPC of the descriptor set, with its idempotency level', () => {
    const paths = rpcs.map((r) => r.path);
    expect(paths).toEqual(
      expect.arrayContaining([
        '/sandnode.vmm.v1.VmService/FenceEpoch',
        '/sandnode.ublk.v1.DeviceService/HandoverAll',
        '/sandnode.server.v1.SandboxService/Exec',
        '/sandnode.podd.v1.PoddService/Quiesce',
      ]),
    );
    expect(new Set(rpcs.map((r) => r.service)).size).toBeGreaterThanOrEqual(8);
    expect(rpcs.find((r) => r.path === '/sandnode.vmm.v1.VmService/GetVm')?.idempotency).toBe('NO_SIDE_EFFECTS');
    expect(rpcs.find((r) => r.path === '/sandnode.server.v1.SandboxService/Exec')?.serverStreaming).toBe(true);
  });

  it('is reproducible: the same seed gives the same cases, another seed others', () => {
    const run = (seed: number) => {
      const rng = seededRandom(seed);
      return rpcs.map((r) => {
        const valid = seedMessage(r.requestType, { sandbox_id: 'sb-00000000000000f1' }, rng);
        return mutate(rng.pick(Object.keys(MUTATIONS) as MutationKind[]), r.requestType, valid, rng).bytes.toString('hex');
      });
    };
    expect(run(42)).toEqual(run(42));
    expect(run(43)).not.toEqual(run(42));
  });

  it('makes every kind for every request type; seeds decode as their type', () => {
    const rng = seededRandom(1);
    for (const r of rpcs) {
      const valid = seedMessage(r.requestType, {}, rng);
      expect(() => r.requestType.decode(valid)).not.toThrow();
      for (const kind of Object.keys(MUTATIONS) as MutationKind[]) expect(mutate(kind, r.requestType, valid, rng).bytes.length).toBeGreaterThanOrEqual(0);
    }
    // an 11-byte varint is malformed for every parser
    const t = rpcs[0]!.requestType;
    expect(() => t.decode(mutate('overlong-varint', t, Buffer.alloc(0), rng).bytes)).toThrow();
  });

  it('encodes varints', () => {
    expect(varint(0).toString('hex')).toBe('00');
    expect(varint(300).toString('hex')).toBe('ac02');
    expect(varint(2n ** 64n - 1n).length).toBe(10);
  });
});
