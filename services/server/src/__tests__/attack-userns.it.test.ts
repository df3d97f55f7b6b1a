/**
 * Attack (issue 10 §2, user namespace): root inside a runc sandbox is host uid 100000 (the
 * supervisor's default `usernsRange` "100000:65536"), not host root. What it makes and runs
 * shows up on the host as that uid; root inside still does what root in a container does to
 * its own files; fork, reset, drain/resume and a kill -9 of the supervisor keep the mapping.
 */
import { execFileSync } from 'node:child_process';
import { lstatSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { killComponent, startComponent, stopComponent } from '@sandnode/node-stack';
import type { ServerApi } from '@sandnode/shared';
import { ForkMethod, SandboxState } from '@sandnode/shared/proto/server/v1/sandbox';
import { describeNode, execCollect, startNode, withEnv, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

const HOST_ROOT_OF_RANGE = 100000;
const IDENTITY = /^\s*0\s+0\s+4294967295\s*$/;

async function sh(api: ServerApi, id: string, script: string): Promise<string> {
  const r = await execCollect(api, id, ['sh', '-c', script]);
  if (r.exitCode !== 0) throw new Error(`${script}: exit ${r.exitCode}: ${r.stderr}`);
  return r.stdout;
}

/** hostUids lists the host uids (real, effective) of every process of sandbox id, from its pids cgroup. */
function hostUids(id: string): number[][] {
  const procs = readFileSync(`/sys/fs/cgroup/pids/sandnode/${id}/cgroup.procs`, 'utf8').trim().split('\n').filter(Boolean);
  const out: number[][] = [];
  for (const pid of procs) {
    try {
      const line = /^Uid:\s+(\d+)\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
      if (line) out.push([Number(line[1]), Number(line[2])]);
    } catch {
      /* exited meanwhile */
    }
  }
  return out;
}

/** The supervisor's env key of `usernsRange`. */
const USERNS_ENV = 'SANDNODE_VMM_SUPERVISOR_USERNS_RANGE';

describeNode('root inside a runc sandbox is not host root (user namespace)', () => {
  let node: TestNode;
  let id: string;
  const vmDir = (sandboxId: string) => path.join(node.dirs.runDir, 'vms', sandboxId);
  const restartSupervisor = async () => {
    await stopComponent(node.dirs, 'vmm-supervisor');
    await startComponent(node.dirs, 'vmm-supervisor');
  };
  beforeAll(async () => {
    node = await startNode();
    id = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!.sandboxId;
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('sees a uid_map and gid_map that are not the identity: 0 inside is host 100000', async () => {
    for (const f of ['uid_map', 'gid_map']) {
      const map = await sh(node.api, id, `cat /proc/self/${f}`);
      expect(map).not.toMatch(IDENTITY);
      expect(map.trim().split(/\s+/).map(Number)).toEqual([0, HOST_ROOT_OF_RANGE, 65536]);
    }
    expect((await sh(node.api, id, 'id -u')).trim()).toBe('0');
  });

  it('every process of the sandbox runs as host uid 100000, none as host root', async () => {
    await sh(node.api, id, '(sleep 30 &) ; true');
    const uids = hostUids(id);
    expect(uids.length).toBeGreaterThan(1);
    for (const [real, effective] of uids) expect([real, effective]).toEqual([HOST_ROOT_OF_RANGE, HOST_ROOT_OF_RANGE]);
    await sh(node.api, id, 'pkill sleep; true');
  });

  it('a setuid-root binary it makes in /workspace is a setuid-100000 file on the host: running it there gives no root', async () => {
    await sh(node.api, id, 'cp /bin/busybox /workspace/sh && chmod 4755 /workspace/sh && echo made > /workspace/made.txt');
    const host = path.join(vmDir(id), 'workspace');
    const st = statSync(path.join(host, 'sh'));
    expect([st.uid, st.gid]).toEqual([HOST_ROOT_OF_RANGE, HOST_ROOT_OF_RANGE]);
    expect(st.mode & 0o4000).toBe(0o4000); // its setuid bit is there, and it names host uid 100000
    expect(statSync(path.join(host, 'made.txt')).uid).toBe(HOST_ROOT_OF_RANGE);
    // an unprivileged host user who runs it does not become root (nor uid 100000: the host mount is nosuid)
    const uid = execFileSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', path.join(host, 'sh'), '-c', 'id -u'], { encoding: 'utf8' }).trim();
    expect(uid).toBe('65534');
  });

  it('files it writes in its rootfs are owned by 100000 in its upper dir on the host', async () => {
    await sh(node.api, id, 'echo x > /etc/hostname.test');
    const st = statSync(path.join(vmDir(id), 'upper-dev', 'upper', 'etc', 'hostname.test'));
    expect([st.uid, st.gid]).toEqual([HOST_ROOT_OF_RANGE, HOST_ROOT_OF_RANGE]);
  });

  it('a host dir it can see (its freeze port dir, bound read-only) is not its own and not writable', async () => {
    // host root's dir appears owned by the overflow uid 65534 (unmapped), its group 100000 as 0
    expect((await sh(node.api, id, 'stat -c %u:%g /run/sandnode-freeze')).trim()).toBe('65534:0');
    const r = await execCollect(node.api, id, ['sh', '-c', 'touch /run/sandnode-freeze/x || chmod 777 /run/sandnode-freeze']);
    expect(r.exitCode).not.toBe(0);
  });

  it("cannot reopen its console (init stdout) through /proc/1/fd/1: the host file is host root's, not flooded, not truncated", async () => {
    const consoleLog = path.join(node.dirs.runDir, 'vm-tmpfs', id, 'console', 'console.log');
    const before = statSync(consoleLog).size;
    const r = await execCollect(node.api, id, ['sh', '-c', 'head -c 1048576 /dev/zero >> /proc/1/fd/1; echo w=$?; true > /proc/1/fd/1; echo t=$?; truncate -s 10G /proc/1/fd/1; echo x=$?']);
    expect(r.stdout).toMatch(/^w=[1-9]\d*\nt=[1-9]\d*\nx=[1-9]\d*\n$/);
    expect(r.stderr).toMatch(/Permission denied/);
    expect(statSync(consoleLog).size).toBeLessThanOrEqual(before + 4096);
    expect(statSync(consoleLog).uid).toBe(0);
  });

  it('root inside does what root in a container does to its own files', async () => {
    const out = await sh(
      node.api,
      id,
      [
        'echo x > /etc/hostname.test2 && cat /etc/hostname.test2',
        'echo "app:x:1000:1000::/home/app:/bin/sh" >> /etc/passwd && echo "app:x:1000:" >> /etc/group',
        'mkdir -p /opt/x /home/app && chown 1000:1000 /home/app && stat -c %u:%g /home/app',
        'touch /workspace/owned && chown 1000:1000 /workspace/owned && stat -c %u /workspace/owned',
        // a "package": a tarball with an owner and modes of its own, unpacked by root into /usr
        'mkdir -p /tmp/pkg/usr/share/pkg && echo data > /tmp/pkg/usr/share/pkg/f && chown -R 1000:1000 /tmp/pkg/usr/share/pkg && chmod 640 /tmp/pkg/usr/share/pkg/f',
        'tar -C /tmp/pkg -czf /tmp/pkg.tgz usr && tar -C / -xzf /tmp/pkg.tgz && stat -c %u:%a /usr/share/pkg/f',
        // and runs as that user
        'su -s /bin/sh app -c "id -u; touch /home/app/mine" && stat -c %u /home/app/mine',
      ].join(' && '),
    );
    expect(out.trim().split('\n')).toEqual(['x', '1000:1000', '1000', '1000:640', '1000', '1000']);
    // on the host each is the range's id of its owner
    expect(statSync(path.join(vmDir(id), 'workspace', 'owned')).uid).toBe(HOST_ROOT_OF_RANGE + 1000);
    expect(statSync(path.join(vmDir(id), 'upper-dev', 'upper', 'usr', 'share', 'pkg', 'f')).uid).toBe(HOST_ROOT_OF_RANGE + 1000);
  });

  it('a fork child keeps the mapping and can write the files its parent made', async () => {
    await sh(node.api, id, 'mkdir -p /opt/forked && echo parent > /opt/forked/f && chmod 600 /opt/forked/f && echo made > /workspace/made.txt && chmod 600 /workspace/made.txt');
    const forked = await node.api.sandboxes.forkSandbox({ parentId: id, maxFreezeMs: 1000 });
    // its podd (host uid 100000) reached the freeze port: the parent was frozen, not paused
    expect(ForkMethod[forked.method]).toBe('FORK_METHOD_QUIESCE');
    const child = forked.sandbox!;
    expect(child.state).toBe(SandboxState.SANDBOX_STATE_RUNNING);
    expect((await sh(node.api, child.sandboxId, 'cat /proc/self/uid_map')).trim().split(/\s+/).map(Number)).toEqual([0, HOST_ROOT_OF_RANGE, 65536]);
    expect(
      await sh(node.api, child.sandboxId, 'echo child >> /opt/forked/f && cat /opt/forked/f && echo w > /workspace/child.txt && echo more >> /workspace/made.txt && cat /workspace/made.txt'),
    ).toBe('parent\nchild\nmade\nmore\n');
    for (const [u] of hostUids(child.sandboxId)) expect(u).toBe(HOST_ROOT_OF_RANGE);
    await node.api.sandboxes.deleteSandbox({ sandboxId: child.sandboxId });
  });

  it('a reset rootfs keeps the mapping: /etc is writable again, /workspace is still its own', async () => {
    const s = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await sh(node.api, s.sandboxId, 'echo before > /workspace/kept && echo junk > /etc/junk');
    await node.api.sandboxes.resetRootfs({ sandboxId: s.sandboxId });
    expect(await sh(node.api, s.sandboxId, 'test ! -e /etc/junk && cat /proc/self/uid_map | tr -s " " && echo y > /etc/after && cat /workspace/kept && echo more >> /workspace/kept')).toBe(
      ` 0 ${HOST_ROOT_OF_RANGE} 65536\nbefore\n`,
    );
    await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });

  it('after a kill -9 of the supervisor the sandbox is adopted with its mapping, and new sandboxes get it too', async () => {
    const before = (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
    await killComponent(node.dirs, 'vmm-supervisor');
    await startComponent(node.dirs, 'vmm-supervisor');
    const after = (await node.api.sandboxes.getSandbox({ sandboxId: id })).sandbox!;
    expect([after.state, after.pid]).toEqual([SandboxState.SANDBOX_STATE_RUNNING, before.pid]);
    expect((await sh(node.api, id, 'cat /proc/self/uid_map')).trim().split(/\s+/).map(Number)).toEqual([0, HOST_ROOT_OF_RANGE, 65536]);
    const fresh = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    expect(await sh(node.api, fresh.sandboxId, 'id -u && echo z > /etc/z && cat /proc/self/uid_map | tr -s " "')).toBe(`0\n 0 ${HOST_ROOT_OF_RANGE} 65536\n`);
    await node.api.sandboxes.deleteSandbox({ sandboxId: fresh.sandboxId });
  });

  it('a sandbox made without the namespace, its tree full of symlinks to host files, is shifted into the range when it boots with it; the host files keep their owner', async () => {
    const victim = mkdtempSync(path.join(os.tmpdir(), 'sandnode-userns-victim-'));
    try {
      writeFileSync(path.join(victim, 'shadow'), 'host\n');
      const owners = () => [victim, path.join(victim, 'shadow')].map((p) => `${statSync(p).uid}:${statSync(p).gid}`);
      await withEnv({ [USERNS_ENV]: '' }, () => restartSupervisor());
      const legacy = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
      expect((await sh(node.api, legacy.sandboxId, 'cat /proc/self/uid_map')).trim().split(/\s+/).map(Number)).toEqual([0, 0, 4294967295]);
      await sh(
        node.api,
        legacy.sandboxId,
        [
          `ln -s ${victim}/shadow /workspace/to-shadow`,
          `ln -s ${victim} /workspace/to-dir`,
          `ln -s ${victim} /etc/to-dir`,
          `ln -s ${victim}/shadow /etc/shadow-link`,
          'mkdir -p /opt/legacy && echo old > /opt/legacy/f && echo old > /workspace/legacy.txt',
        ].join(' && '),
      );
      const drained = node.cli(['drain', '--deadline-ms', '20000', '--json']);
      expect(drained.status).toBe(0);
      await restartSupervisor(); // with the default range
      await startComponent(node.dirs, 'ublk-manager');
      for (const sb of (await node.api.sandboxes.listSandboxes({})).sandboxes) await node.api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId });
      expect(owners()).toEqual(['0:0', '0:0']);
      expect(readFileSync(path.join(victim, 'shadow'), 'utf8')).toBe('host\n');
      // its own tree is the range's now, and root inside writes its old files
      expect(lstatSync(path.join(vmDir(legacy.sandboxId), 'workspace', 'to-shadow')).uid).toBe(HOST_ROOT_OF_RANGE);
      expect(
        await sh(node.api, legacy.sandboxId, 'echo new >> /opt/legacy/f && echo new >> /workspace/legacy.txt && cat /opt/legacy/f /workspace/legacy.txt && cat /proc/self/uid_map | tr -s " "'),
      ).toBe(`old\nnew\nold\nnew\n 0 ${HOST_ROOT_OF_RANGE} 65536\n`);
      await node.api.sandboxes.deleteSandbox({ sandboxId: legacy.sandboxId });
      expect(owners()).toEqual(['0:0', '0:0']);
    } finally {
      rmSync(victim, { recursive: true, force: true });
    }
  });

  it('a drained sandbox resumes with the mapping and its own files still writable', async () => {
    const s = (await node.api.sandboxes.createSandbox({ template: 'base' })).sandbox!;
    await sh(node.api, s.sandboxId, 'mkdir -p /opt/d && echo 1 > /opt/d/f && chmod 600 /opt/d/f && echo w > /workspace/d && chmod 600 /workspace/d');
    const r = node.cli(['drain', '--deadline-ms', '20000', '--json']);
    expect(r.status).toBe(0);
    await startComponent(node.dirs, 'ublk-manager');
    for (const sb of (await node.api.sandboxes.listSandboxes({})).sandboxes) await node.api.sandboxes.resumeSandbox({ sandboxId: sb.sandboxId });
    expect(await sh(node.api, s.sandboxId, 'echo 2 >> /opt/d/f && cat /opt/d/f && cat /workspace/d && cat /proc/self/uid_map | tr -s " "')).toBe(`1\n2\nw\n 0 ${HOST_ROOT_OF_RANGE} 65536\n`);
    await node.api.sandboxes.deleteSandbox({ sandboxId: s.sandboxId });
  });
});
