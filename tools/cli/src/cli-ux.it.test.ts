/**
 * The CLI's read formats, deletes and logs against a real node: `-o json|yaml|wide`, `template
 * delete` (refused while used, NOT_FOUND, --if-exists), `sandbox delete --if-exists`, `logs`
 * (also `-f` across `upgrade server`), `sandbox logs`, and `drain` -> `status` -> `down --purge`.
 */
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { parse } from 'yaml';
import { findRunning, pidFile } from '@sandnode/node-stack';
import { describeNode, startNode, waitFor, type TestNode } from '@sandnode/testkit';

jest.setTimeout(300_000);

describeNode('sandnode CLI formats, deletes and logs', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('prints list/get/template list/status as --json (unchanged), -o json (proto mapping), -o yaml and -o wide', () => {
    const s = JSON.parse(node.cli(['sandbox', 'create', '--metadata', 'who=ux', '--json']).stdout) as { id: string };
    const legacy = JSON.parse(node.cli(['sandbox', 'list', '--json']).stdout) as { id: string; created_at: string }[];
    expect(legacy.map((x) => x.id)).toEqual([s.id]);
    expect(legacy[0]?.created_at).toMatch(/Z$/);
    const proto = JSON.parse(node.cli(['sandbox', 'list', '-o', 'json']).stdout) as { sandboxes: { sandboxId: string; state: string; metadata: Record<string, string> }[] };
    expect(proto.sandboxes).toEqual([expect.objectContaining({ sandboxId: s.id, state: 'SANDBOX_STATE_RUNNING', metadata: { who: 'ux' } })]);
    expect(parse(node.cli(['sandbox', 'list', '-o', 'yaml']).stdout)).toEqual(proto);
    const wide = node.cli(['sandbox', 'list', '-o', 'wide']).stdout;
    expect(wide.split('\n')[0]).toMatch(/^ID +STATE +PID +TEMPLATE +CREATED +ADDRESS +EXPIRES +FORKED FROM +METADATA$/);
    expect(wide).toContain('who=ux');

    const get = JSON.parse(node.cli(['sandbox', 'get', s.id, '-o', 'json']).stdout) as { sandbox: { sandboxId: string } };
    expect(get.sandbox.sandboxId).toBe(s.id);
    const tl = JSON.parse(node.cli(['template', 'list', '-o', 'json']).stdout) as { templates: { name: string; poddVersion: string }[] };
    expect(tl.templates.map((t) => t.name)).toEqual(['base']);
    expect(node.cli(['template', 'list', '-o', 'wide']).stdout).toMatch(/BUILD MS +ROOTFS/);
    const st = parse(node.cli(['status', '-o', 'yaml']).stdout) as { components: { name: string; up: boolean }[]; sandboxes: number };
    expect(st).toMatchObject({ sandboxes: 1 });
    expect(st.components.every((c) => c.up)).toBe(true);
    expect(node.cli(['status', '-o', 'wide']).stdout).toMatch(/FEATURES +NODE ID/);
    // the default table counts the features; -o wide names them
    expect(node.cli(['status']).stdout).not.toMatch(/server\.[a-z.-]+\.v\d/);
    expect(node.cli(['status', '-o', 'wide']).stdout).toMatch(/server\.[a-z.-]+\.v\d/);
    // piped: no colour escapes anywhere
    expect(node.cli(['status']).stdout).not.toContain('\x1b[');

    // errors keep the gRPC code with -o json / yaml; a bad format is a usage error
    const bad = node.cli(['sandbox', 'get', 'sb-0000000000000000', '-o', 'yaml']);
    expect(bad.status).toBe(1);
    expect(JSON.parse(bad.stderr)).toMatchObject({ error: { code: 'NOT_FOUND', grpcCode: 5 } });
    expect(node.cli(['sandbox', 'list', '-o', 'xml']).status).toBe(2);
    expect(node.cli(['sandbox', 'list', '--json', '-o', 'yaml']).status).toBe(2);

    // delete --if-exists: a missing one is no error (and is said), without it NOT_FOUND
    const del = node.cli(['sandbox', 'delete', s.id, 'sb-0000000000000000', '--if-exists', '--json']);
    expect({ status: del.status, out: JSON.parse(del.stdout) as unknown }).toEqual({ status: 0, out: { deleted: [s.id], absent: ['sb-0000000000000000'] } });
    const again = node.cli(['sandbox', 'delete', s.id, '--json']);
    expect(again.status).toBe(1);
    expect(JSON.parse(again.stderr)).toMatchObject({ error: { code: 'NOT_FOUND' } });
  });

  it('deletes a template only when no sandbox uses it; NOT_FOUND after, --if-exists then succeeds', () => {
    expect(node.cli(['template', 'build', 'ux-del', '--json']).status).toBe(0);
    const s = JSON.parse(node.cli(['sandbox', 'create', '--template', 'ux-del', '--json']).stdout) as { id: string };
    const used = node.cli(['template', 'delete', 'ux-del', '--json']);
    expect(used.status).toBe(1);
    expect(JSON.parse(used.stderr)).toMatchObject({ error: { code: 'FAILED_PRECONDITION', grpcCode: 9 } });
    expect(used.stderr).toContain(s.id);
    // nothing changed: the sandbox runs and the template is still listed
    expect(node.cli(['sandbox', 'exec', s.id, '--', 'true']).status).toBe(0);
    expect(JSON.parse(node.cli(['template', 'list', '--json']).stdout)).toEqual([expect.objectContaining({ name: 'base' }), expect.objectContaining({ name: 'ux-del' })]);

    expect(node.cli(['sandbox', 'delete', s.id]).status).toBe(0);
    const ok = node.cli(['template', 'delete', 'ux-del']);
    expect({ status: ok.status, stderr: ok.stderr }).toEqual({ status: 0, stderr: '' });
    expect(ok.stdout).toMatch(/^template ux-del deleted \(\d+\.\d MiB freed\)/);
    expect((JSON.parse(node.cli(['template', 'list', '--json']).stdout) as { name: string }[]).map((t) => t.name)).toEqual(['base']);
    const gone = node.cli(['template', 'delete', 'ux-del', '--json']);
    expect(gone.status).toBe(1);
    expect(JSON.parse(gone.stderr)).toMatchObject({ error: { code: 'NOT_FOUND', grpcCode: 5 } });
    const ifExists = node.cli(['template', 'delete', 'ux-del', '--if-exists', '--json']);
    expect({ status: ifExists.status, out: JSON.parse(ifExists.stdout) as unknown }).toEqual({ status: 0, out: { deleted: null, template: null } });
    expect(node.cli(['template', 'delete', '../base']).status).toBe(1);
    expect(node.cli(['template', 'list', '--json']).stdout).toContain('"base"');
  });

  it("prints the daemons' logs and a sandbox's console; says what exists when there is none", () => {
    const server = node.cli(['logs', 'server', '-n', '3']);
    expect(server.status).toBe(0);
    const lines = server.stdout.trim().split('\n');
    expect(lines).toHaveLength(3);
    const pid = findRunning(node.dirs, 'server')!.pid;
    expect(lines.some((l) => (JSON.parse(l) as { pid: number }).pid === pid)).toBe(true);
    const all = node.cli(['logs', '--since', '1h']);
    expect(all.status).toBe(0);
    for (const c of ['vmm-supervisor', 'ublk-manager', 'server']) expect(all.stdout).toMatch(new RegExp(`^${c} +\\| \\{`, 'm'));
    expect(node.cli(['logs', 'nope']).status).toBe(2);
    expect(node.cli(['logs', '--since', 'yesterday']).status).toBe(2);

    const s = JSON.parse(node.cli(['sandbox', 'create', '--json']).stdout) as { id: string };
    const con = node.cli(['sandbox', 'logs', s.id]);
    expect(con.status).toBe(0);
    expect(node.cli(['sandbox', 'logs', 'sb-0000000000000000']).stderr).toMatch(/no console of sb-0000000000000000 on this node \(looked at /);
    expect(node.cli(['sandbox', 'logs', '../../etc']).status).toBe(2);
    expect(node.cli(['sandbox', 'delete', s.id]).status).toBe(0);
  });

  it('logs -f follows the server that runs after `upgrade server`', async () => {
    const oldPid = findRunning(node.dirs, 'server')!.pid;
    const child = spawn(process.execPath, [require.resolve('@sandnode/cli/dist/main.js'), '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, 'logs', 'server', '-f', '-n', '0'], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    try {
      const up = node.cli(['upgrade', 'server', '--from-build', '.', '--json']);
      expect(up.status).toBe(0);
      const newPid = (JSON.parse(up.stdout) as { newPid: number }).newPid;
      expect(newPid).not.toBe(oldPid);
      await waitFor('logs -f to switch to the new server', () => err.includes(`server is now pid ${newPid}, writing `), 20_000);
      await waitFor("a line of the new server's in logs -f", () => out.split('\n').some((l) => l.startsWith('{') && (JSON.parse(l) as { pid: number }).pid === newPid), 20_000);
      // the file it follows is the one the new server writes, not logs/server.log
      expect(err).toMatch(/writing \S+\/logs\/server-[ab]\.log: following that file/);
    } finally {
      child.kill('SIGINT');
    }
  });

  it('drain -> status shows no stale pid -> down --purge deletes the drained sandboxes', () => {
    const ids = [0, 1].map(() => (JSON.parse(node.cli(['sandbox', 'create', '--json']).stdout) as { id: string }).id);
    const dr = node.cli(['drain']);
    expect(dr.status).toBe(0);
    for (const id of ids) expect(dr.stdout).toContain(`${id}: preserved in`);
    expect(dr.stdout).toContain('lost: running processes and memory');
    expect(dr.stdout).toMatch(/drained 2 of 2 sandboxes in \d+ ms; device manager stopped/);
    expect(existsSync(pidFile(node.dirs, 'ublk-manager'))).toBe(false);
    const st = node.cli(['status']);
    expect(st.stdout).not.toContain('stale pid file');
    expect(st.stdout).toContain('2 DRAINED');
    // the device manager the drain stopped is "stopped", and the node counts as running (exit 0)
    expect(st.stdout).toMatch(/ublk-manager +stopped +- +- \(stopped by the drain of 2 sandboxes/);
    expect(st.status).toBe(0);

    const down = node.cli(['down', '--purge', '--json']);
    expect({ status: down.status, stderr: down.stderr }).toEqual({ status: 0, stderr: expect.stringContaining('started ublk-manager') });
    const r = JSON.parse(down.stdout) as { deleted: string[]; startedForPurge: string[] };
    expect(r.deleted.sort()).toEqual([...ids].sort());
    expect(r.startedForPurge).toEqual(['ublk-manager']);
  });
});
