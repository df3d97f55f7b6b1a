/**
 * Terminal escapes (security finding b): names a sandbox chooses (files in /workspace, the
 * argv of its processes) and the error details that carry them reach the operator's terminal
 * through the real CLI. None of stdout or stderr may hold a raw control character a terminal
 * acts on (C0 but \n and \t, DEL, C1): they are shown as \xNN (people) or \u00NN (--json).
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { describeNode, startNode, type TestNode } from '@sandnode/testkit';

jest.setTimeout(240_000);

// eslint-disable-next-line no-control-regex
const RAW = /[\x00-\x08\x0b-\x1f\x7f-\x9f]/;
/** Names with a screen clear, an 8-bit CSI, DEL, a clipboard write (OSC 52), CR and backspace. */
const EVIL = ['clear\x1b[2J', 'csi\u009b31m', 'del\x7f', 'osc\x1b]52;c;b3duZWQ=\x07', 'cr\rhide', 'bs\b\b'];

describeNode('attack: sandbox-chosen strings carry terminal escapes to the CLI', () => {
  let node: TestNode;
  let id: string;
  let local: string;
  const started: ChildProcess[] = [];
  beforeAll(async () => {
    node = await startNode();
    id = (JSON.parse(node.cli(['sandbox', 'create', '--template', 'base', '--json']).stdout) as { id: string }).id;
    local = mkdtempSync(path.join(os.tmpdir(), 'sandnode-escapes-'));
    // the sandbox makes the names itself (printf interprets the escapes inside the sandbox)
    const mk = node.cli(['sandbox', 'exec', id, '--', 'sh', '-c', 'mkdir -p /workspace/tree/a/b/c && for n in "$@"; do : > "/workspace/tree/$n"; : > "/workspace/tree/a/b/c/$n"; done', 'sh', ...EVIL]);
    expect({ status: mk.status, stderr: mk.stderr }).toEqual({ status: 0, stderr: '' });
  });
  afterAll(async () => {
    for (const c of started) if (c.exitCode === null) c.kill('SIGKILL');
    if (id) node?.cli(['sandbox', 'delete', id]);
    await node?.stop();
    if (local) rmSync(local, { recursive: true, force: true });
  });

  const clean = (what: string, r: { stdout: string; stderr: string }) => {
    expect({ what, rawInStdout: RAW.exec(r.stdout)?.[0], rawInStderr: RAW.exec(r.stderr)?.[0] }).toEqual({ what, rawInStdout: undefined, rawInStderr: undefined });
  };

  test('ls and stat (human and --json) show the names escaped; --json still parses to the real names', () => {
    const ls = node.cli(['sandbox', 'ls', id, 'tree']);
    expect(ls.status).toBe(0);
    clean('ls', ls);
    expect(ls.stdout).toContain('clear\\x1b[2J');
    expect(ls.stdout).toContain('csi\\x9b31m');
    expect(ls.stdout).toContain('del\\x7f');
    const js = node.cli(['sandbox', 'ls', id, 'tree', '--json']);
    clean('ls --json', js);
    const names = (JSON.parse(js.stdout) as { entries: { name?: string; path?: string }[] }).entries.map((e) => path.basename(e.name ?? e.path ?? ''));
    for (const n of EVIL) expect(names).toContain(n);
    for (const args of [
      ['stat', id, `tree/${EVIL[0]}`],
      ['stat', id, `tree/${EVIL[1]}`, '--json'],
    ])
      clean(`sandbox ${args.join(' ')}`, node.cli(['sandbox', ...args]));
  });

  test('NOT_FOUND errors that name a sandbox path (human and --json) are escaped', () => {
    for (const json of [[], ['--json']]) {
      const r = node.cli(['sandbox', 'stat', id, `tree/missing${EVIL[0]}${EVIL[1]}`, ...json]);
      expect(r.status).toBe(1);
      clean(`stat missing ${json.join('')}`, r);
      expect(r.stderr).toMatch(/NOT_FOUND/);
      const cp = node.cli(['sandbox', 'cp', `${id}:/workspace/tree/gone${EVIL[3]}`, path.join(local, 'gone'), ...json]);
      expect(cp.status).toBe(1);
      clean(`cp missing ${json.join('')}`, cp);
    }
    const e = node.cli(['sandbox', 'exec', id, '--', `/no/such${EVIL[0]}${EVIL[2]}`]);
    expect(e.status).not.toBe(0);
    clean('exec of a missing command', e);
  });

  test('cp of a deep tree out of the sandbox prints no raw control character and copies the names as they are', () => {
    const dst = path.join(local, 'tree');
    for (const json of [[], ['--json']]) {
      rmSync(dst, { recursive: true, force: true });
      const r = node.cli(['sandbox', 'cp', `${id}:/workspace/tree`, dst, ...json]);
      expect({ status: r.status, stderr: r.stderr }).toEqual({ status: 0, stderr: '' });
      clean(`cp tree ${json.join('')}`, r);
    }
    expect(existsSync(dst)).toBe(true);
    expect(readdirSync(path.join(dst, 'a', 'b', 'c')).sort()).toEqual([...EVIL].sort());
  });

  test('ps shows the argv of a process with its escapes escaped (human, --json, -o json|yaml|wide)', async () => {
    const cliMain = require.resolve('@sandnode/cli/dist/main.js');
    // a long command with escapes in its argv; runs until the test ends (killed by its pid)
    const child = spawn(
      process.execPath,
      [cliMain, '--state-dir', node.dirs.stateDir, '--run-dir', node.dirs.runDir, '--listen', '', 'sandbox', 'exec', id, '--', 'sh', '-c', 'sleep 120', `sleeper${EVIL[0]}${EVIL[1]}${EVIL[2]}`],
      { stdio: 'ignore' },
    );
    started.push(child);
    let ps = node.cli(['sandbox', 'ps', id]);
    for (let i = 0; i < 100 && !ps.stdout.includes('sleeper'); i++) {
      await new Promise((r) => setTimeout(r, 100));
      ps = node.cli(['sandbox', 'ps', id]);
    }
    expect(ps.stdout).toContain('sleeperclear\\x1b[2Jcsi\\x9b31mdel\\x7f');
    clean('ps', ps);
    for (const o of [['--json'], ['-o', 'json'], ['-o', 'yaml'], ['-o', 'wide']]) clean(`ps ${o.join(' ')}`, node.cli(['sandbox', 'ps', id, ...o]));
    const js = JSON.parse(node.cli(['sandbox', 'ps', id, '--json']).stdout) as { processes: { argv: string[] }[] };
    expect(js.processes.some((p) => p.argv.includes(`sleeper${EVIL[0]}${EVIL[1]}${EVIL[2]}`))).toBe(true);
    child.kill('SIGKILL');
  });
});
