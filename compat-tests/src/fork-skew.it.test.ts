/**
 * Fork against 0.1.0 peers, with real processes (the 0.1.0 build from releases.json, built
 * from git, and the working tree N):
 * - a sandbox from a 0.1.0 template (podd without "podd.quiesce") forks by pause -> clone ->
 *   resume and says so; one from an N template forks by quiesce;
 * - records written by N (fork children, a reset rootfs) survive a read-modify-write by the
 *   0.1.0 server: it ignores the new fields and keeps them;
 * - with the 0.1.0 ublk-manager (no "ublk.clone") ForkSandbox fails FAILED_PRECONDITION naming
 *   the component, its version and the feature, and nothing is left half-made.
 * Skips naming what is missing (root, runc, busybox-static, loop devices, e2fsprogs, the
 * builds); fails instead under CI=true.
 */
import { spawnSync } from 'node:child_process';
import path from 'node:path';
import Database from 'better-sqlite3';
import { RuntimeRecord } from '@sandnode/shared/proto/server/v1/record';
import { ForkMethod, SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { TempNode } from './node';
import { describeWith } from '@sandnode/testkit';
import { COMPAT_PARTS, compatBuilds } from './prereq';
import { execCollect, grpcStatusOf, readAll } from './scenarios';
import type { Build } from './types';

jest.setTimeout(20 * 60_000);

/** The release whose components lack every fork feature. */
const OLD = '0.1.0';

const pre = compatBuilds(OLD);

/** The fields N added to RuntimeRecord (0.1.0 must keep them through a rewrite). */
function newFields(bytes: Buffer): Record<string, unknown> {
  const r = RuntimeRecord.decode(bytes);
  return { rootfsGeneration: r.rootfsGeneration, forkedFrom: r.forkedFrom, machineId: r.machineId, forkPausedAtMs: r.forkPausedAtMs, resetUpperDeviceId: r.resetUpperDeviceId };
}

describeWith(
  `fork against ${OLD} peers`,
  COMPAT_PARTS,
  () => {
    const old = pre.older as Build;
    const n = pre.n as Build;
    let node: TempNode;
    beforeAll(async () => {
      node = new TempNode(n, 'sandnode-forkskew-');
      await node.buildTemplate('podd-old', old);
      await node.buildTemplate('podd-n', n);
      for (const c of ['vmm-supervisor', 'ublk-manager', 'server'] as const) await node.start(c, n);
    });
    afterAll(async () => {
      if (node) await node.down();
    });

    const ids: Record<string, string> = {};

    it(`a sandbox from a ${OLD} template forks by pause (its podd lacks "podd.quiesce"); one from an N template by quiesce`, async () => {
      const api = node.api;
      for (const t of ['podd-old', 'podd-n']) {
        const s = (await api.sandboxes.createSandbox({ template: t })).sandbox!;
        await api.sandboxes.writeFile({ sandboxId: s.sandboxId, path: 'data.txt', data: Buffer.from(`from ${t}`) });
        // written without fsync right before the fork: the fork must flush it (pause path: host sync)
        expect((await execCollect(api, s.sandboxId, ['sh', '-c', 'echo last > /workspace/last.txt; echo last > /etc/last.txt'])).exitCode).toBe(0);
        const r = await api.sandboxes.forkSandbox({ parentId: s.sandboxId });
        expect(ForkMethod[r.method]).toBe(t === 'podd-old' ? 'FORK_METHOD_PAUSE' : 'FORK_METHOD_QUIESCE');
        const child = r.sandbox!;
        expect(child.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
        expect(child.forkedFrom).toBe(s.sandboxId);
        expect((await readAll(api, child.sandboxId, 'data.txt')).toString()).toBe(`from ${t}`);
        expect((await execCollect(api, child.sandboxId, ['cat', '/workspace/last.txt', '/etc/last.txt'])).stdout).toBe('last\nlast\n');
        await api.sandboxes.writeFile({ sandboxId: child.sandboxId, path: 'data.txt', data: Buffer.from('child') });
        expect((await readAll(api, s.sandboxId, 'data.txt')).toString()).toBe(`from ${t}`);
        const p = (await api.sandboxes.getSandbox({ sandboxId: s.sandboxId })).sandbox!;
        expect([SandboxState[p.state], p.pid]).toEqual(['SANDBOX_STATE_RUNNING', s.pid]);
        ids[t] = s.sandboxId;
        ids[`${t}-child`] = child.sandboxId;
      }
      const reset = (await api.sandboxes.resetRootfs({ sandboxId: ids['podd-n']! })).sandbox!;
      expect(reset.rootfsGeneration).toBe(2);
    });

    it(`records written by N survive a read-modify-write by the ${OLD} server`, async () => {
      const db = path.join(node.dirs.stateDir, 'records.db');
      const read = () => {
        const h = new Database(db, { readonly: true });
        try {
          return new Map((h.prepare('SELECT sandbox_id, record FROM records').all() as { sandbox_id: string; record: Buffer }[]).map((r) => [r.sandbox_id, r.record]));
        } finally {
          h.close();
        }
      };
      const before = read();
      expect(newFields(before.get(ids['podd-n-child']!)!)).toMatchObject({ forkedFrom: ids['podd-n'], rootfsGeneration: 1 });
      expect(newFields(before.get(ids['podd-n']!)!)).toMatchObject({ rootfsGeneration: 2 });

      await node.stop('server');
      await node.start('server', old);
      let api = node.reconnect();
      // 0.1.0 adopted every sandbox and does not know the fields: they are not in its answers
      const seen = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes;
      expect(seen.map((s) => s.sandboxId).sort()).toEqual([...before.keys()].sort());
      expect(seen.every((s) => s.state === SandboxState.SANDBOX_STATE_RUNNING && s.forkedFrom === '' && s.rootfsGeneration === 0)).toBe(true);
      // read-modify-write of every record by 0.1.0
      for (const id of before.keys()) await api.sandboxes.setTimeout({ sandboxId: id, timeoutSeconds: 3600 });
      await api.sandboxes.pauseSandbox({ sandboxId: ids['podd-n']! });
      await api.sandboxes.resumeSandbox({ sandboxId: ids['podd-n']! });
      const rewritten = read();
      for (const [id, bytes] of before) {
        expect(Buffer.compare(rewritten.get(id)!, bytes)).not.toBe(0); // 0.1.0 did rewrite it
        expect({ id, ...newFields(rewritten.get(id)!) }).toEqual({ id, ...newFields(bytes) });
      }

      await node.stop('server');
      await node.start('server', n);
      api = node.reconnect();
      const child = (await api.sandboxes.getSandbox({ sandboxId: ids['podd-n-child']! })).sandbox!;
      expect(child).toMatchObject({ forkedFrom: ids['podd-n'], rootfsGeneration: 1, state: SandboxState.SANDBOX_STATE_RUNNING });
      expect((await api.sandboxes.getSandbox({ sandboxId: ids['podd-n']! })).sandbox!.rootfsGeneration).toBe(2);
      expect(child.expiresAtMs).toBeGreaterThan(Date.now()); // 0.1.0's write is there too
      const r = await execCollect(api, ids['podd-n-child']!, ['cat', '/workspace/data.txt']);
      expect(r.stdout).toBe('child');
    });

    it(`with the ${OLD} ublk-manager ForkSandbox fails FAILED_PRECONDITION naming it, and nothing is made`, async () => {
      await node.stop('ublk-manager');
      await node.start('ublk-manager', old);
      const api = node.reconnect();
      const before = (await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => s.sandboxId).sort();
      const err = await api.sandboxes.forkSandbox({ parentId: ids['podd-n']! }).catch((e: unknown) => e);
      expect(grpcStatusOf(err)).toBe('FAILED_PRECONDITION');
      expect((err as Error).message).toContain(`ublk-manager ${old.version}`);
      expect((err as Error).message).toContain('"ublk.clone"');
      expect((await api.sandboxes.listSandboxes({ pageSize: 1000 })).sandboxes.map((s) => s.sandboxId).sort()).toEqual(before);
      const devices = spawnSync('losetup', ['-l', '-n', '-O', 'BACK-FILE'], { encoding: 'utf8' })
        .stdout.split('\n')
        // the N ublk-manager's image pool (an XFS file on its own loop device, left mounted for the older one) is no sandbox's device
        .filter((l) => l.includes(node.dirs.stateDir) && !l.includes('/ublk-manager/pool/'));
      expect(devices.length).toBe(before.length * 2);
      // the rest still works with the older device manager
      const r = await execCollect(api, ids['podd-n']!, ['echo', 'ok']);
      expect(r.stdout).toBe('ok\n');
    });
  },
  pre.missing,
);
