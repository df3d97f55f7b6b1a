/**
 * SandboxService's network fields over the manager on scripted peers (no gRPC): CreateSandbox
 * answers the access token (the same one for a repeat by request_id) and Sandbox.network with
 * the ingress URL; ForkSandbox the child's own token; UpdateSandboxNetwork the new policy.
 */
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { createLogger, InvalidArgumentError } from '@sandnode/shared';
import { SqliteRecordStore } from '../store/sqlite-record-store';
import { managerOptions, Peers } from '../core/__tests__/fake-peers';
import { SandboxManager } from '../core/sandbox-manager';
import { sandboxService } from './sandbox-service';

const log = createLogger('test', '0', 'silent');
/** the server call context the handlers get (only its signal is used) */
const ctx = { signal: new AbortController().signal } as unknown as Parameters<ReturnType<typeof sandboxService>['createSandbox']>[1];

describe('SandboxService network fields', () => {
  let dir: string;
  let store: SqliteRecordStore;
  let svc: ReturnType<typeof sandboxService>;

  beforeEach(() => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'sandnode-svc-net-'));
    store = new SqliteRecordStore(path.join(dir, 'records.db'), log);
    const peers = new Peers();
    peers.network = true;
    svc = sandboxService(new SandboxManager(managerOptions(peers, store, dir)), { streams: 0 }, { listen: '127.0.0.1:8480', domain: 'localhost' });
  });
  afterEach(() => {
    store.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const req = { template: 'base', timeoutSeconds: 0, metadata: {}, resources: undefined, requestId: 'rq-1', network: undefined, env: {} };

  it('CreateSandbox: the token and the network with its ingress URL; a repeat by request_id the same token; fork its own', async () => {
    const a = await svc.createSandbox(req, ctx);
    const id = a.sandbox!.sandboxId!;
    expect(a.accessToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(a.sandbox!.network).toMatchObject({ slot: 0, address: '10.209.0.2', public: false, ingressUrl: `http://{port}-${id}.localhost:8480` });
    expect(a.repeat).toBe(false);
    const again = await svc.createSandbox(req, ctx);
    expect(again.accessToken).toBe(a.accessToken);
    // the repeat says it created nothing (the CLI then does not print "created in 0 ms")
    expect(again).toMatchObject({ repeat: true, sandbox: { sandboxId: id } });
    // a repeat that asks for something else is refused, not silently given the first sandbox (newcomer)
    await expect(svc.createSandbox({ ...req, metadata: { a: 'b' } }, ctx)).rejects.toThrow(InvalidArgumentError);
    await expect(svc.createSandbox({ ...req, metadata: { a: 'b' } }, ctx)).rejects.toThrow(/other metadata/);
    await expect(svc.createSandbox({ ...req, network: { disabled: true, egress: undefined, public: false } }, ctx)).rejects.toThrow(/has a network; this repeat asks for none/);
    expect(store.list()).toHaveLength(1);
    expect((await svc.getSandbox({ sandboxId: id }, ctx)).sandbox!.network?.address).toBe('10.209.0.2');
    const f = await svc.forkSandbox({ parentId: id, metadata: {}, timeoutSeconds: 0, maxFreezeMs: 0, requestId: '', network: undefined }, ctx);
    expect(f.accessToken).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(f.accessToken).not.toBe(a.accessToken);
    expect(f.sandbox!.network?.slot).toBe(1);
  });

  it('no network: no token and no Sandbox.network', async () => {
    const r = await svc.createSandbox({ ...req, requestId: '', network: { disabled: true, egress: undefined, public: false } }, ctx);
    expect(r.accessToken).toBe('');
    expect(r.sandbox!.network).toBeUndefined();
  });

  it('UpdateSandboxNetwork answers the sandbox with the canonical new policy', async () => {
    const id = (await svc.createSandbox(req, ctx)).sandbox!.sandboxId!;
    const u = await svc.updateSandboxNetwork({ sandboxId: id, egress: { allowOut: ['Example.com'], denyOut: [], blockAll: true }, public: true }, ctx);
    expect(u.sandbox!.network).toMatchObject({ egress: { allowOut: ['example.com'], denyOut: [], blockAll: true }, public: true });
  });

  it('an allow_out wholly inside an always-denied range is INVALID_ARGUMENT and changes nothing; one that only overlaps it is taken', async () => {
    // the fake supervisor's node always denies 10.0.0.0/8
    const bad = { allowOut: ['10.1.2.0/24', 'example.com'], denyOut: [], blockAll: true };
    await expect(svc.createSandbox({ ...req, requestId: '', network: { disabled: false, egress: bad, public: false } }, ctx)).rejects.toMatchObject({
      message: expect.stringMatching(/network\.egress\.allow_out: 10\.1\.2\.0\/24 \(inside 10\.0\.0\.0\/8\): this node always denies/),
    });
    expect(store.list()).toEqual([]);

    const id = (await svc.createSandbox(req, ctx)).sandbox!.sandboxId!;
    const before = (await svc.getSandbox({ sandboxId: id }, ctx)).sandbox!.network!.egress;
    await expect(svc.updateSandboxNetwork({ sandboxId: id, egress: { allowOut: ['10.9.9.9'], denyOut: [], blockAll: true }, public: undefined }, ctx)).rejects.toMatchObject({
      message: expect.stringMatching(/^egress\.allow_out: 10\.9\.9\.9\/32 \(inside 10\.0\.0\.0\/8\)/),
    });
    expect((await svc.getSandbox({ sandboxId: id }, ctx)).sandbox!.network!.egress).toEqual(before);

    const wide = await svc.updateSandboxNetwork({ sandboxId: id, egress: { allowOut: ['0.0.0.0/0'], denyOut: [], blockAll: true }, public: undefined }, ctx);
    expect(wide.sandbox!.network!.egress!.allowOut).toEqual(['0.0.0.0/0']);
  });
});
