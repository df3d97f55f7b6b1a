import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { DEFAULT_FREEZE_PORT_TIMEOUT_MS, DEFAULT_SOCKET, loadPoddConfig } from './config';
import type { ConfigNote } from '@sandnode/shared';
import { parseFlags } from './flags';

describe('loadPoddConfig', () => {
  let dir: string;
  beforeAll(() => (dir = mkdtempSync(path.join(os.tmpdir(), 'podd-cfg-'))));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('defaults, env overrides, flags over env', () => {
    expect(loadPoddConfig({ env: {} })).toMatchObject({ socket: DEFAULT_SOCKET, listenFd: -1, freezePortTimeoutMs: DEFAULT_FREEZE_PORT_TIMEOUT_MS });
    const env = { SANDNODE_PODD_SOCKET: '/run/a.sock', SANDNODE_PODD_FREEZE_PORT_TIMEOUT_MS: '500' };
    expect(loadPoddConfig({ env })).toMatchObject({ socket: '/run/a.sock', freezePortTimeoutMs: 500 });
    expect(loadPoddConfig({ env, overrides: { socket: '/run/b.sock' } }).socket).toBe('/run/b.sock');
  });

  test('a config file is read; a bad value names the key, an unknown key is noted and ignored unless required', () => {
    const file = path.join(dir, 'podd.json');
    writeFileSync(file, JSON.stringify({ version: 1, defaultCwd: '/srv' }));
    expect(loadPoddConfig({ file, env: {} }).defaultCwd).toBe('/srv');
    writeFileSync(file, JSON.stringify({ version: 1, defaultcwd: '/srv' }));
    const notes: ConfigNote[] = [];
    expect(loadPoddConfig({ file, env: {}, notes }).defaultCwd).toBe('/workspace');
    expect(notes.map((n) => n.keys)).toEqual([['defaultcwd']]);
    writeFileSync(file, JSON.stringify({ version: 2, required: ['defaultcwd'], defaultcwd: '/srv' }));
    expect(() => loadPoddConfig({ file, env: {} })).toThrow(/does not know: defaultcwd/);
    expect(() => loadPoddConfig({ env: { SANDNODE_PODD_DEFAULT_CWD: 'rel' } })).toThrow(/key "defaultCwd".*absolute path/);
  });
});

describe('parseFlags', () => {
  test('flags with separate or inline values', () => {
    expect(parseFlags(['--config', '/c.json', '--socket=/s.sock', '--listen-fd', '3'])).toEqual({ config: '/c.json', socket: '/s.sock', listenFd: '3' });
    expect(parseFlags(['--help'])).toEqual({ help: true });
  });

  test('--config without its value and unknown arguments are usage errors naming them', () => {
    expect(() => parseFlags(['--config'])).toThrow(/--config needs a value/);
    expect(() => parseFlags(['--config='])).toThrow(/--config needs a value/);
    expect(() => parseFlags(['--config', '--socket', '/s'])).toThrow(/--config needs a value/);
    expect(() => parseFlags(['--bogus'])).toThrow(/unknown argument "--bogus"/);
    expect(() => parseFlags(['stray'])).toThrow(/unknown argument "stray"/);
  });
});
