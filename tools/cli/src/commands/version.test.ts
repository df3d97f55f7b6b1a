/**
 * `sandnode version`: the entries on their own, and the built CLI (`npm run build` first)
 * against component servers of this test's own (the shared VersionService on each
 * component's socket in a temp run dir; ublk-manager left down).
 */
import { execFile } from 'node:child_process';
import { mkdirSync, rmSync } from 'node:fs';
import path from 'node:path';
import { SUITE_VERSION, createLogger, createServiceServer, socketPath, unixAddress, versionResponse, type ComponentInfo, type ServiceServer } from '@sandnode/shared';
import type { GetVersionResponse } from '@sandnode/shared/proto/common/v1/version';
import { built, describeWith, makeTempDir } from '@sandnode/testkit';
import { cliVersion, componentVersion, runtimeOf, versionTable, type VersionReport } from './version';

const MAIN = path.resolve(__dirname, '..', '..', 'dist', 'main.js');

const answer = (extra: Partial<GetVersionResponse> = {}): GetVersionResponse => ({
  component: 'server',
  version: '9.9.1',
  commit: 'c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00',
  features: [],
  pid: 4242,
  startedAtMs: 0,
  runtime: '', // what a build before the field decodes to
  nodeId: '', // the same
  ...extra,
});

describe('version entries', () => {
  it('reads the runtime a component sends, "unknown" when its build sends none', () => {
    expect(runtimeOf(answer({ runtime: 'node 24.22.3' }))).toBe('node 24.22.3');
    expect(runtimeOf(answer())).toBe('unknown');
    expect(runtimeOf(answer({ runtime: '' }))).toBe('unknown');
  });

  it('a component that answers, one that does not, and the CLI itself', () => {
    expect(componentVersion('server', answer({ runtime: 'node 24.22.3' }))).toEqual({
      component: 'server',
      up: true,
      version: '9.9.1',
      commit: 'c0ffee00c0ffee00c0ffee00c0ffee00c0ffee00',
      runtime: 'node 24.22.3',
      pid: 4242,
      nodeId: null,
    });
    expect(componentVersion('server', answer({ nodeId: 'worker-7' })).nodeId).toBe('worker-7');
    expect(componentVersion('ublk-manager', undefined)).toEqual({ component: 'ublk-manager', up: false, version: null, commit: null, runtime: null, pid: null, nodeId: null });
    expect(cliVersion()).toMatchObject({ component: 'cli', up: true, version: SUITE_VERSION, runtime: `node ${process.versions.node}`, pid: process.pid });
    expect(cliVersion().commit).toMatch(/^([0-9a-f]{40}|unknown)$/);
  });

  it('prints one row per entry for people, the commit shortened', () => {
    const r: VersionReport = {
      cli: { component: 'cli', up: true, version: '0.3.0', commit: 'abcdef0123456789', runtime: 'node 24.22.3', pid: 1, nodeId: null },
      components: [componentVersion('server', answer({ nodeId: 'node-1' })), componentVersion('ublk-manager', undefined)],
    };
    expect(versionTable(r).split('\n')).toEqual([
      'COMPONENT     VERSION  COMMIT        RUNTIME       NODE',
      'cli           0.3.0    abcdef012345  node 24.22.3  -',
      'server        9.9.1    c0ffee00c0ff  unknown       node-1',
      'ublk-manager  down     -             -             -',
    ]);
  });
});

describeWith('the built CLI: sandnode version --json', [built('@sandnode/cli')], () => {
  let root: string;
  const servers: ServiceServer[] = [];
  const infos: Record<'vmm-supervisor' | 'server', ComponentInfo> = {
    'vmm-supervisor': { component: 'vmm-supervisor', version: '9.9.2', commit: 'aaaa', features: ['vmm.runc'], nodeId: 'worker-3' },
    server: { component: 'server', version: '9.9.3', commit: 'bbbb', features: [] },
  };

  beforeAll(async () => {
    root = makeTempDir('cli-version');
    mkdirSync(path.join(root, 'run'));
    for (const c of ['vmm-supervisor', 'server'] as const) {
      const s = createServiceServer({ info: infos[c], log: createLogger(c, infos[c].version, 'silent') });
      await s.listen([unixAddress(socketPath(path.join(root, 'run'), c))]);
      servers.push(s);
    }
  });
  afterAll(async () => {
    await Promise.all(servers.map((s) => s.shutdown(0)));
    rmSync(root, { recursive: true, force: true });
  });

  it("prints the CLI's and each component's version, commit and runtime; a component that is down says so", async () => {
    // asynchronous: the servers answer from this process's event loop
    const { code, stdout } = await new Promise<{ code: number | null; stdout: string }>((resolve) => {
      const child = execFile(process.execPath, [MAIN, '--run-dir', path.join(root, 'run'), '--state-dir', path.join(root, 'state'), 'version', '--json'], { timeout: 30_000 }, (_err, out) =>
        resolve({ code: child.exitCode, stdout: out }),
      );
    });
    expect(code).toBe(0);
    const r = JSON.parse(stdout) as VersionReport;
    expect(r.cli).toMatchObject({ component: 'cli', up: true, version: SUITE_VERSION, runtime: `node ${process.versions.node}` });
    // a runtime field in shared's GetVersion answer (once the proto has one) is passed through
    const sent = (c: keyof typeof infos) => (versionResponse(infos[c]) as { runtime?: string }).runtime || 'unknown';
    expect(r.components).toEqual([
      { component: 'vmm-supervisor', up: true, version: '9.9.2', commit: 'aaaa', runtime: sent('vmm-supervisor'), pid: process.pid, nodeId: 'worker-3' },
      { component: 'ublk-manager', up: false, version: null, commit: null, runtime: null, pid: null, nodeId: null },
      { component: 'server', up: true, version: '9.9.3', commit: 'bbbb', runtime: sent('server'), pid: process.pid, nodeId: null },
    ]);
  });
});
