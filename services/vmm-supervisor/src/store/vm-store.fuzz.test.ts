/**
 * Store fuzz (issue 11 §3): for each seed, the VM table gets good rows plus random bytes,
 * truncated JSON, `{}`, rows duplicated under another key, newer-schema rows and rows with a
 * mistyped field (written as another process might, bypassing put()). Opening the store never
 * throws; every good row is served as written (a newer release's unknown field kept); every bad
 * row is quarantined with a reason and never served; the store still writes. A failure names its
 * seed (FUZZ_SEED=n re-runs it).
 */
import path from 'node:path';
import Database from 'better-sqlite3';
import { seededRandom, useTempDir, type Rng } from '@sandnode/testkit';
import { VM_RECORD_SCHEMA, type VmRecord } from '../core/types';
import { SqliteVmStore, VM_TABLE_FILE } from './sqlite-vm-store';

const SEEDS = process.env.FUZZ_SEED ? [Number(process.env.FUZZ_SEED)] : Array.from({ length: 60 }, (_, i) => i + 1);

const good = (vmId: string, r: Rng): VmRecord & Record<string, unknown> => ({
  schema: 1,
  vmId,
  state: r.pick(['creating', 'running', 'paused', 'stopped'] as const),
  pid: r.int(0, 1 << 22),
  startTimeTicks: r.int(0, 1e9),
  driver: 'runc',
  driverVersion: '1.1.5',
  spec: {
    templateRootfs: '/t',
    drives: r.chance(0.5) ? [{ driveId: 'upper', path: '/dev/loop1', role: 'rootfs-upper', readOnly: false }] : [],
    resources: { vcpus: r.int(0, 8), memoryMib: r.int(0, 4096), diskBytes: 0 },
    poddSocketDir: '/p',
    hostname: 'h',
    env: { A: 'x'.repeat(r.int(0, 20)) },
  },
  createdAtMs: r.int(0, 1e12),
  apiSocket: '',
  driverBinary: '',
  // a field a newer release added: kept as it is
  ...(r.chance(0.5) ? { futureField: { n: r.int(0, 9) } } : {}),
});

/** badRow is [key, raw record] of a row this version cannot read. */
function badRow(r: Rng, key: string, goods: VmRecord[]): [string, unknown] {
  const json = JSON.stringify(good(key, r));
  const mutate = (f: (o: Record<string, unknown>) => void) => {
    const o = JSON.parse(json) as Record<string, unknown>;
    f(o);
    return JSON.stringify(o);
  };
  switch (r.int(0, 8)) {
    case 0:
      return [key, r.bytes(r.int(1, 40))];
    case 1:
      return [key, json.slice(0, r.int(0, json.length - 1))];
    case 2:
      return [key, r.pick(['{}', '[]', 'null', '1', '"x"', ''])];
    case 3:
      return [key, JSON.stringify(r.pick(goods))];
    case 4:
      return [key, mutate((o) => (o.schema = VM_RECORD_SCHEMA + r.int(1, 99)))];
    case 5:
      return [key, mutate((o) => (o[r.pick(['pid', 'startTimeTicks', 'createdAtMs'])] = r.pick([-1, 1.5, '7', null])))];
    case 6:
      return [key, mutate((o) => (o.state = r.pick(['migrating', '', 'RUNNING', 9])))];
    case 7:
      return [key, mutate((o) => ((o.spec as Record<string, unknown>)[r.pick(['drives', 'resources', 'env', 'templateRootfs'])] = r.pick([null, 3, [1], true])))];
    default:
      return [r.pick(['', '../x', 'a b']), mutate((o) => (o.vmId = r.pick(['', '../x', 'a b'])))];
  }
}

describe('VM table fuzz at open', () => {
  const tmp = useTempDir('vmm-vmfuzz');

  it.each(SEEDS)('seed %i: the store opens, serves the good rows, quarantines the bad ones with a reason', (seed) => {
    const r = seededRandom(seed);
    const dir = tmp();
    SqliteVmStore.forStateDir(dir).close();
    const goods = Array.from({ length: r.int(1, 5) }, (_, i) => good(`vm-g${i}-${r.int(0, 999)}`, r));
    const bads = Array.from({ length: r.int(1, 10) }, (_, i) => badRow(r, `vm-b${i}-${r.int(0, 999)}`, goods));
    const db = new Database(path.join(dir, VM_TABLE_FILE));
    const ins = db.prepare('INSERT OR IGNORE INTO vms (vm_id, record) VALUES (?, ?)');
    db.transaction(() => {
      for (const g of goods) ins.run(g.vmId, JSON.stringify(g));
      for (const [k, raw] of bads) ins.run(k, raw);
    })();
    db.close();

    let s!: SqliteVmStore;
    expect(() => (s = SqliteVmStore.forStateDir(dir))).not.toThrow();
    const want = [...goods].sort((a, b) => (a.vmId < b.vmId ? -1 : 1));
    expect({ seed, list: s.list() }).toEqual({ seed, list: want });
    const keys = new Set(bads.map(([k]) => k));
    const held = s.quarantined();
    expect({ seed, quarantined: new Set(held.map((q) => q.vmId)) }).toEqual({ seed, quarantined: keys });
    for (const q of held) expect({ seed, id: q.vmId, reason: q.reason.length > 0, served: s.get(q.vmId) !== undefined }).toEqual({ seed, id: q.vmId, reason: true, served: false });
    // the store still writes; good rows and the quarantine survive a reopen
    const fresh = good(`vm-new-${seed}`, r);
    s.put(fresh);
    s.close();
    const again = SqliteVmStore.forStateDir(dir);
    expect(again.list().map((v) => v.vmId)).toEqual([...want.map((v) => v.vmId), fresh.vmId].sort());
    expect(again.quarantined().length).toBe(held.length);
    again.close();
  });
});
