/**
 * The network part of the sandbox lifecycle with a real SQLite store and a scripted
 * vmm-supervisor (fake-peers: slots, keep_network, UpdateVmNetwork, ReleaseNetworkSlot): what
 * a create gets on a node with and without network, fork, drain -> resume on the same slot,
 * what delete and undo free, the orphan sweep, UpdateSandboxNetwork, the directory and the
 * adoption check. The kernel side is the supervisor's own tests; the real node runs after merge.
 */
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, statSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { AbortedError, createLogger, FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';
import { waitFor } from '@sandnode/testkit';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { adoptAll } from './adoption';
import { AccessTokens, loadAccessTokenKey } from './network';
import { MapNetworkDirectory } from './network-directory';
import { sweepOrphans } from './orphan-sweep';
import { managerOptions, Peers } from './__tests__/fake-peers';
import { SandboxManager, type CreateSandboxArgs } from './sandbox-manager';

const log = createLogger('test', '0', 'silent');
const sha = (t: string) => createHash('sha256').update(t).digest('hex');
const DEFAULT_POLICY = { allowOut: [], denyOut: [], blockAll: false };

describe('sandbox network lifecycle', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let peers: Peers;
  let m: SandboxManager;
  let key: Buffer;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-network-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    peers = new Peers();
    peers.network = true;
    key = randomBytes(32);
    m = new SandboxManager(managerOptions(peers, store, dir, { accessTokenKey: key }));
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const create = (extra: Partial<CreateSandboxArgs> = {}, signal?: AbortSignal) =>
    m.create({ template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: '', ...extra }, signal);
  const nothingMade = () => {
    expect(store.list()).toEqual([]);
    expect(peers.devices.size).toBe(0);
    expect(peers.vms.size).toBe(0);
    expect(peers.slots.size).toBe(0);
  };

  describe('create', () => {
    it('network unset on a node with network: the default policy on a slot of its own, recorded, in the directory, with its token', async () => {
      const rec = await create();
      expect(peers.netEvents).toEqual([`create ${rec.sandboxId} slot=-1`]);
      expect(store.get(rec.sandboxId)?.network).toEqual({
        slot: 0,
        address: '10.209.0.2',
        gateway: '10.209.0.1',
        egress: DEFAULT_POLICY,
        public: false,
        accessTokenSha256: expect.stringMatching(/^[0-9a-f]{64}$/),
        hostIfname: 'snfakev0',
      });
      const token = m.accessToken(rec);
      expect(token).toMatch(/^[A-Za-z0-9_-]{43}$/);
      expect(sha(token)).toBe(rec.network?.accessTokenSha256);
      expect(m.directory.byAddress('10.209.0.2')).toMatchObject({ sandboxId: rec.sandboxId, state: 'RUNNING', slot: 0, public: false, poddAddress: rec.poddAddress });
      expect(m.directory.bySandboxId(rec.sandboxId)?.accessTokenSha256).toBe(rec.network?.accessTokenSha256);
    });

    it('network unset with a 0.2.0 supervisor, or one whose network is off: no network, none asked of the supervisor', async () => {
      peers.network = false;
      const a = await create();
      peers.network = true;
      peers.networkEnabled = false;
      const b = await create();
      expect(peers.netEvents).toEqual([]);
      for (const r of [a, b]) {
        expect(store.get(r.sandboxId)?.network).toBeUndefined();
        expect(m.accessToken(r)).toBe('');
      }
      expect(m.directory.size).toBe(0);
    });

    it('network set with a 0.2.0 supervisor: FAILED_PRECONDITION naming the supervisor, its version and the feature; nothing made', async () => {
      peers.network = false;
      const p = create({ network: { disabled: false, egress: { allowOut: ['example.com'], denyOut: [], blockAll: true }, public: false } });
      await expect(p).rejects.toThrow(FailedPreconditionError);
      await expect(p).rejects.toThrow('vmm-supervisor 0.2.0 lacks feature "vmm.network.v1"');
      nothingMade();
    });

    it('network set on a node whose network is off: FAILED_PRECONDITION saying why; network.disabled creates without', async () => {
      peers.networkEnabled = false;
      await expect(create({ network: { disabled: false, egress: undefined, public: true } })).rejects.toThrow(/network is off: nft not found/);
      nothingMade();
      const r = await create({ network: { disabled: true, egress: undefined, public: false } });
      expect(r.network).toBeUndefined();
    });

    it('a bad policy is INVALID_ARGUMENT naming the field; nothing made, nothing asked', async () => {
      const p = create({ network: { disabled: false, egress: { allowOut: ['example.com', '10.1.2.3/8'], denyOut: [], blockAll: false }, public: false } });
      await expect(p).rejects.toThrow(InvalidArgumentError);
      await expect(p).rejects.toThrow(/^network\.egress\.allow_out\[1\]: "10\.1\.2\.3\/8" has host bits set/);
      await expect(create({ network: { disabled: false, egress: { allowOut: [], denyOut: ['example.com'], blockAll: false }, public: false } })).rejects.toThrow(/network\.egress\.deny_out\[0\]/);
      nothingMade();
      expect(peers.netEvents).toEqual([]);
    });

    it('the policy is recorded canonical and given to the supervisor; public is kept', async () => {
      const r = await create({
        network: { disabled: false, egress: { allowOut: ['Example.COM', '198.51.100.7', '*.api.test', 'example.com'], denyOut: ['203.0.113.0/24'], blockAll: true }, public: true },
      });
      const want = { allowOut: ['198.51.100.7/32', '*.api.test', 'example.com'], denyOut: ['203.0.113.0/24'], blockAll: true };
      expect(store.get(r.sandboxId)?.network).toMatchObject({ egress: want, public: true });
      expect(peers.vms.get(r.sandboxId)?.network?.egress).toEqual(want);
      expect(m.directory.bySandboxId(r.sandboxId)?.policy.allowDomains.map((d) => d.text)).toEqual(['*.api.test', 'example.com']);
    });

    it('a repeat by request_id answers the same sandbox and the same token (derived, not stored)', async () => {
      const a = await create({ requestId: 'rq-net' });
      const b = await create({ requestId: 'rq-net' });
      expect(b.sandboxId).toBe(a.sandboxId);
      expect(m.accessToken(b)).toBe(m.accessToken(a));
      // a restarted server with the same node key derives it too; another key gives none
      const again = new SandboxManager(managerOptions(peers, store, dir, { accessTokenKey: key }));
      expect(again.accessToken(store.get(a.sandboxId)!)).toBe(m.accessToken(a));
      const other = new SandboxManager(managerOptions(peers, store, dir, { accessTokenKey: randomBytes(32) }));
      expect(other.accessToken(store.get(a.sandboxId)!)).toBe('');
      expect(JSON.stringify(store.get(a.sandboxId))).not.toContain(m.accessToken(a));
    });

    it('a create undone (its caller went away while podd was awaited) frees its slot and leaves the directory', async () => {
      peers.poddHealthy = false;
      const ac = new AbortController();
      const p = create({}, ac.signal);
      await waitFor('the VM to be made', () => peers.vms.size === 1);
      expect(peers.slots.size).toBe(1);
      ac.abort(new Error('caller went away'));
      await expect(p).rejects.toThrow('caller went away');
      nothingMade();
      expect(m.directory.size).toBe(0);
    });
  });

  describe('fork', () => {
    it('the child gets a slot and token of its own and the parent policy and publicness; an override replaces them', async () => {
      const parent = await create({ network: { disabled: false, egress: { allowOut: ['example.com'], denyOut: [], blockAll: true }, public: true } });
      const r = await m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '' });
      expect(r.child.network).toMatchObject({ slot: 1, address: '10.209.0.6', egress: parent.network!.egress, public: true });
      expect(m.accessToken(r.child)).not.toBe(m.accessToken(parent));
      expect(sha(m.accessToken(r.child))).toBe(r.child.network?.accessTokenSha256);
      const o = await m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: { disabled: false, egress: undefined, public: false } });
      expect(o.child.network).toMatchObject({ slot: 2, egress: DEFAULT_POLICY, public: false });
      const none = await m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: { disabled: true, egress: undefined, public: false } });
      expect(none.child.network).toBeUndefined();
      expect(m.directory.size).toBe(3);
    });

    it('on a node that lost its network (supervisor rolled back) a child inherits none; an explicit network is FAILED_PRECONDITION', async () => {
      const parent = await create({ network: { disabled: false, egress: { allowOut: ['example.com'], denyOut: [], blockAll: true }, public: false } });
      peers.network = false;
      const r = await m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '' });
      expect(r.child.network).toBeUndefined();
      await expect(
        m.fork({ parentId: parent.sandboxId, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: { disabled: false, egress: undefined, public: false } }),
      ).rejects.toThrow(/asks for a network/);
    });

    it('a bad override is INVALID_ARGUMENT before anything is made', async () => {
      const parent = await create();
      const p = m.fork({
        parentId: parent.sandboxId,
        metadata: {},
        timeoutSeconds: 0,
        maxFreezeMs: 0,
        requestId: '',
        network: { disabled: false, egress: { allowOut: ['*'], denyOut: [], blockAll: false }, public: false },
      });
      await expect(p).rejects.toThrow(/^network\.egress\.allow_out\[0\]/);
      expect(store.list().map((x) => x.sandboxId)).toEqual([parent.sandboxId]);
    });
  });

  describe('drain, resume, delete', () => {
    it('drain keeps the slot reserved; resume takes that slot and the same address; delete frees it', async () => {
      const r = await create();
      const id = r.sandboxId;
      await m.drainOne(id);
      expect(peers.netEvents).toContain(`delete ${id} keep=true`);
      expect(peers.slots.get(0)).toMatchObject({ state: 'RESERVED', owner: id });
      expect(store.get(id)).toMatchObject({ state: 'DRAINED', network: { slot: 0, address: '10.209.0.2' } });
      expect(m.directory.bySandboxId(id)?.state).toBe('DRAINED');
      // another sandbox meanwhile does not get the reserved slot
      const other = await create();
      expect(other.network?.slot).toBe(1);
      const back = await m.resume(id);
      expect(peers.netEvents).toContain(`create ${id} slot=0`);
      expect(back.network).toMatchObject({ slot: 0, address: '10.209.0.2' });
      expect(m.directory.byAddress('10.209.0.2')).toMatchObject({ sandboxId: id, state: 'RUNNING' });
      await m.delete(id);
      expect(peers.slots.has(0)).toBe(false);
      expect(m.directory.bySandboxId(id)).toBeUndefined();
      expect(m.directory.byAddress('10.209.0.2')).toBeUndefined();
    });

    it('resume of a DRAINED networked sandbox on a node that lost its network (supervisor rolled back) is FAILED_PRECONDITION and boots nothing', async () => {
      const r = await create();
      await m.drainOne(r.sandboxId);
      peers.network = false;
      await expect(m.resume(r.sandboxId)).rejects.toThrow(`sandbox ${r.sandboxId} has a network (slot 0, 10.209.0.2), but vmm-supervisor 0.2.0 lacks feature "vmm.network.v1"; it stays DRAINED`);
      expect(peers.vms.size).toBe(0);
      expect(store.get(r.sandboxId)?.state).toBe('DRAINED');
    });

    it('a VM made without the network its record names (the supervisor ignored it) is deleted and the boot fails', async () => {
      const r = await create();
      await m.drainOne(r.sandboxId);
      // a supervisor that says it has network but makes the VM without one
      const status = peers.vmPort.networkStatus!;
      peers.network = false;
      peers.vmPort.networkStatus = async () => ({ ...(await status()), available: true, reason: '' });
      await expect(m.resume(r.sandboxId)).rejects.toThrow(/made its VM without a network/);
      expect(peers.vms.size).toBe(0);
      expect(store.get(r.sandboxId)?.state).toBe('DRAINED');
    });

    it('delete of a DRAINED sandbox releases its reserved slot by owner', async () => {
      const r = await create();
      await m.drainOne(r.sandboxId);
      await m.delete(r.sandboxId);
      expect(peers.netEvents).toContain(`release 0 ${r.sandboxId}`);
      expect(peers.slots.size).toBe(0);
      expect(m.directory.size).toBe(0);
    });

    it('ResetRootfs boots the sandbox again on the same slot and address', async () => {
      const r = await create();
      await create(); // slot 1 taken meanwhile: a freed slot 0 could go to the next create
      await m.resetRootfs(r.sandboxId);
      expect(peers.netEvents).toEqual(expect.arrayContaining([`delete ${r.sandboxId} keep=true`, `create ${r.sandboxId} slot=0`]));
      expect(store.get(r.sandboxId)?.network).toMatchObject({ slot: 0, address: '10.209.0.2' });
      expect(m.directory.byAddress('10.209.0.2')?.sandboxId).toBe(r.sandboxId);
    });

    it('pause and resume keep the directory state in step', async () => {
      const r = await create();
      await m.pause(r.sandboxId);
      expect(m.directory.bySandboxId(r.sandboxId)?.state).toBe('PAUSED');
      await m.resume(r.sandboxId);
      expect(m.directory.bySandboxId(r.sandboxId)?.state).toBe('RUNNING');
    });
  });

  describe('UpdateSandboxNetwork', () => {
    const policy = { allowOut: ['pypi.org', '*.pythonhosted.org'], denyOut: [], blockAll: true };

    it('RUNNING: the VM first, then the record, then the directory; public changes only when given', async () => {
      const r = await create();
      const u = await m.updateNetwork({ sandboxId: r.sandboxId, egress: policy, public: true });
      expect(peers.netEvents.at(-1)).toBe(`update ${r.sandboxId} *.pythonhosted.org,pypi.org`);
      expect(store.get(r.sandboxId)?.network).toMatchObject({ egress: { allowOut: ['*.pythonhosted.org', 'pypi.org'], blockAll: true }, public: true });
      expect(m.directory.bySandboxId(r.sandboxId)?.policy.blockAll).toBe(true);
      expect(u.network?.public).toBe(true);
      await m.updateNetwork({ sandboxId: r.sandboxId, egress: undefined });
      expect(store.get(r.sandboxId)?.network).toMatchObject({ egress: DEFAULT_POLICY, public: true });
    });

    it('a call the supervisor refuses (fenced: ABORTED) changes neither record nor directory', async () => {
      const r = await create();
      peers.updateNetworkError = new AbortedError('epoch 3 is below the highest seen, 4');
      await expect(m.updateNetwork({ sandboxId: r.sandboxId, egress: policy })).rejects.toThrow(AbortedError);
      expect(store.get(r.sandboxId)?.network?.egress).toEqual(DEFAULT_POLICY);
      expect(m.directory.bySandboxId(r.sandboxId)?.policy.blockAll).toBe(false);
    });

    it('DRAINED: the record only, applied at resume', async () => {
      const r = await create();
      await m.drainOne(r.sandboxId);
      peers.netEvents = [];
      await m.updateNetwork({ sandboxId: r.sandboxId, egress: policy });
      expect(peers.netEvents).toEqual([]);
      await m.resume(r.sandboxId);
      expect(peers.vms.get(r.sandboxId)?.network?.egress).toEqual({ allowOut: ['*.pythonhosted.org', 'pypi.org'], denyOut: [], blockAll: true });
    });

    it('refuses a sandbox without network (FAILED_PRECONDITION) and a bad policy (INVALID_ARGUMENT), asking nothing', async () => {
      const r = await create({ network: { disabled: true, egress: undefined, public: false } });
      await expect(m.updateNetwork({ sandboxId: r.sandboxId, egress: policy })).rejects.toThrow(
        new FailedPreconditionError(`sandbox ${r.sandboxId} has no network (created with network disabled, on a node without network, or by an older server)`),
      );
      const n = await create();
      peers.netEvents = [];
      await expect(m.updateNetwork({ sandboxId: n.sandboxId, egress: { allowOut: ['a..b'], denyOut: [], blockAll: false } })).rejects.toThrow(/^egress\.allow_out\[0\]/);
      await expect(m.updateNetwork({ sandboxId: 'sb-nope', egress: undefined })).rejects.toThrow(InvalidArgumentError);
      expect(peers.netEvents).toEqual([]);
    });
  });

  describe('orphan sweep and adoption', () => {
    it('releases slots reserved for sandbox ids no record has, never one of a record or of another kind of owner', async () => {
      const kept = await create();
      await m.drainOne(kept.sandboxId);
      peers.slots.set(5, { slot: 5, state: 'RESERVED', owner: 'sb-00000000000000aa', vmId: '', address: '10.209.0.22' });
      peers.slots.set(6, { slot: 6, state: 'RESERVED', owner: 'someone-else', vmId: '', address: '10.209.0.26' });
      peers.slots.set(7, { slot: 7, state: 'SPARE', owner: '', vmId: '', address: '10.209.0.30' });
      const swept = await sweepOrphans({ store, vms: peers.vmPort, devices: peers.devicePort, runDir: path.join(dir, 'run'), log });
      expect(swept.slots).toEqual(['slot 5 of sb-00000000000000aa']);
      expect([...peers.slots.keys()].sort()).toEqual([0, 6, 7]);
    });

    it('adoption rebuilds the directory from the records and reports a VM whose network differs', async () => {
      const a = await create();
      const b = await create();
      const drained = await create();
      await m.drainOne(drained.sandboxId);
      peers.vms.get(b.sandboxId)!.network!.address = '10.209.0.99';
      const fresh = new MapNetworkDirectory();
      fresh.set({ ...m.directory.bySandboxId(a.sandboxId)!, sandboxId: 'sb-00000000000000ff', address: '10.209.9.9' });
      const m2 = new SandboxManager(managerOptions(peers, store, dir, { accessTokenKey: key, directory: fresh }));
      const report = await adoptAll({ store, vms: peers.vmPort, devices: peers.devicePort, podd: peers.podd, manager: m2, log });
      expect(report.networkMismatch).toEqual([{ sandboxId: b.sandboxId, reason: `its record names network slot 1 (10.209.0.6), its VM has slot 1 (10.209.0.99)` }]);
      expect(fresh.sandboxIds().sort()).toEqual([a.sandboxId, b.sandboxId, drained.sandboxId].sort());
      expect(fresh.byAddress('10.209.9.9')).toBeUndefined();
      expect(fresh.bySandboxId(drained.sandboxId)?.state).toBe('DRAINED');
    });
  });
});

describe('access token key', () => {
  it('is made once (32 bytes, 0600) and read again; tokens are 43 base64url characters, one per sandbox id', () => {
    const dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-tokenkey-'));
    try {
      const k1 = loadAccessTokenKey(dir);
      expect(k1.length).toBe(32);
      expect(statSync(path.join(dir, 'access-token.key')).mode & 0o777).toBe(0o600);
      expect(loadAccessTokenKey(dir).equals(k1)).toBe(true);
      const t = new AccessTokens(k1);
      expect(t.tokenOf('sb-0000000000000001')).toMatch(/^[A-Za-z0-9_-]{43}$/);
      expect(t.tokenOf('sb-0000000000000001')).not.toBe(t.tokenOf('sb-0000000000000002'));
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
