/**
 * The operator CLI against a real node: JSON shapes for scripts and exit codes.
 */
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(180_000);

describeNode('sandnode CLI', () => {
  let node: TestNode;
  beforeAll(async () => {
    node = await startNode();
  });
  afterAll(async () => {
    await node?.stop();
  });

  it('creates, gets, lists, execs, pauses, resumes and deletes with --json', () => {
    const c = node.cli(['sandbox', 'create', '--template', 'base', '--metadata', 'who=cli', '--json']);
    expect(c.stderr).toBe('');
    expect(c.status).toBe(0);
    const s = JSON.parse(c.stdout) as { id: string; state: string; pid: number; metadata: Record<string, string> };
    expect(s).toMatchObject({ state: 'RUNNING', metadata: { who: 'cli' } });
    expect(s.pid).toBeGreaterThan(1);

    const g = JSON.parse(node.cli(['sandbox', 'get', s.id, '--json']).stdout) as typeof s;
    expect(g).toMatchObject({ id: s.id, state: 'RUNNING', pid: s.pid });
    const l = JSON.parse(node.cli(['sandbox', 'list', '--json']).stdout) as (typeof s)[];
    expect(l.map((x) => x.id)).toEqual([s.id]);

    const e = node.cli(['sandbox', 'exec', s.id, '--', 'sh', '-c', 'echo hi; echo oops >&2; exit 3']);
    expect([e.status, e.stdout, e.stderr]).toEqual([3, 'hi\n', 'oops\n']);
    expect(node.cli(['sandbox', 'pause', s.id, '--json']).stdout).toContain('"PAUSED"');
    expect(node.cli(['sandbox', 'resume', s.id, '--json']).stdout).toContain('"RUNNING"');

    const st = JSON.parse(node.cli(['status', '--json']).stdout) as { components: { name: string; version: string; pid: number; features: string[] }[]; sandboxes: number };
    expect(st.sandboxes).toBe(1);
    expect(st.components.map((x) => x.name)).toEqual(['vmm-supervisor', 'ublk-manager', 'server']);
    for (const comp of st.components) {
      expect(comp.pid).toBeGreaterThan(1);
      expect(comp.version).toMatch(/^\d+\.\d+\.\d+/);
      expect(comp.features.length).toBeGreaterThan(0);
    }

    const bad = node.cli(['sandbox', 'get', 'sb-0000000000000000']);
    expect(bad.status).toBe(1);
    expect(bad.stderr).toMatch(/^sandnode: NOT_FOUND: /);
    const badJson = node.cli(['sandbox', 'get', 'sb-0000000000000000', '--json']);
    expect({ status: badJson.status, stdout: badJson.stdout }).toEqual({ status: 1, stdout: '' });
    expect(JSON.parse(badJson.stderr)).toMatchObject({ error: { code: 'NOT_FOUND', grpcCode: 5, exitCode: 1 } });
    // options of the command need --: without it the CLI refuses (exit 2) and runs nothing
    const noDashes = node.cli(['sandbox', 'exec', s.id, 'ls', '-la']);
    expect(noDashes.status).toBe(2);
    expect(noDashes.stderr).toContain(`sandnode sandbox exec ${s.id} -- ls -la`);
    expect(node.cli(['sandbox', 'exec', s.id, '--', 'ls', '-la', '/']).status).toBe(0);
    expect(node.cli(['sandbox', 'delete', s.id]).status).toBe(0);
    expect(JSON.parse(node.cli(['sandbox', 'list', '--json']).stdout)).toEqual([]);
  });

  it("prints the CLI's and every running component's version, commit and runtime", () => {
    const r = node.cli(['version', '--json']);
    expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
    const v = JSON.parse(r.stdout) as { cli: { runtime: string }; components: { component: string; up: boolean; version: string; commit: string; runtime: string; pid: number }[] };
    expect(v.cli.runtime).toBe(`node ${process.versions.node}`);
    expect(v.components.map((c) => c.component)).toEqual(['vmm-supervisor', 'ublk-manager', 'server']);
    for (const c of v.components) {
      expect(c).toMatchObject({ up: true, version: expect.stringMatching(/^\d+\.\d+\.\d+/), commit: expect.stringMatching(/\S/) });
      expect(c.pid).toBeGreaterThan(1);
      // "unknown" until the daemons' GetVersion carries the runtime field
      expect(c.runtime).toMatch(/^(node \d+\.\d+\.\d+|unknown)$/);
    }
  });

  it('lists templates', () => {
    const t = JSON.parse(node.cli(['template', 'list', '--json']).stdout) as { name: string; poddVersion: string }[];
    expect(t.map((x) => x.name)).toEqual(['base']);
  });
});
