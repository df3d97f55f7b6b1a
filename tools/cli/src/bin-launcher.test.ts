/**
 * The committed launcher (tools/cli/bin/sandnode.js) run as a process from a copy in a temp
 * tree, so that "not built" and "a dependency below dist/main.js is missing" can be staged
 * without touching this checkout's dist/.
 */
import { spawnSync } from 'node:child_process';
import { copyFileSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { makeTempDir } from '@sandnode/testkit';

const BIN = path.resolve(__dirname, '..', 'bin', 'sandnode.js');

describe('bin/sandnode.js', () => {
  let root: string;
  let bin: string;
  beforeEach(() => {
    root = makeTempDir('bin');
    mkdirSync(path.join(root, 'bin'));
    bin = path.join(root, 'bin', 'sandnode.js');
    copyFileSync(BIN, bin);
  });
  afterEach(() => rmSync(root, { recursive: true, force: true }));

  const run = () => spawnSync(process.execPath, [bin, '--help'], { encoding: 'utf8' });

  it('says "not built yet" when dist/main.js is absent', () => {
    const r = run();
    expect(r.status).toBe(1);
    expect(r.stderr).toBe('sandnode: not built yet; run: npm run build\n');
  });

  it('names the missing module, not "not built", when a dependency of dist/main.js is missing', () => {
    mkdirSync(path.join(root, 'dist'));
    writeFileSync(path.join(root, 'dist', 'main.js'), "require('sandnode-no-such-dependency');\n");
    const r = run();
    expect(r.status).toBe(1);
    expect(r.stderr).not.toContain('not built yet');
    expect(r.stderr).toContain("Cannot find module 'sandnode-no-such-dependency'");
    expect(r.stderr).toContain('bash deploy/host-setup.sh');
  });

  it('runs dist/main.js when it is there', () => {
    mkdirSync(path.join(root, 'dist'));
    writeFileSync(path.join(root, 'dist', 'main.js'), "process.stdout.write('ran ' + process.argv.slice(2).join(' '));\n");
    const r = run();
    expect(r.stderr).toBe('');
    expect(r.stdout).toBe('ran --help');
    expect(r.status).toBe(0);
  });
});

describe('npx sandnode on a terminal', () => {
  const REPO = path.resolve(__dirname, '..', '..', '..');

  // npm's progress spinner (braille frames redrawn with ESC[1G ESC[0K) went to the terminal
  // before and after every command, and into an `exec -it` session; the repo's .npmrc turns it off.
  // script(1) is in bsdutils, an Essential package of Debian: never skipped.
  it("prints only the command's output, no npm spinner (under script(1), a pty)", () => {
    const env = { ...process.env };
    for (const k of Object.keys(env)) if (/^npm_config_progress$/i.test(k)) delete env[k];
    const r = spawnSync('script', ['-qec', 'npx sandnode version --help', '/dev/null'], { cwd: REPO, env, encoding: 'utf8', timeout: 60000 });
    expect(r.status).toBe(0);
    expect(r.stdout).toContain('Usage: sandnode version');
    expect(r.stdout).not.toMatch(/[\u2800-\u28ff]/);
    expect(r.stdout).not.toContain('\u001b[1G');
  });
});
