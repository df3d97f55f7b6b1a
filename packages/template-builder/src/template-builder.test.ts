import { existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, readlinkSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { AlreadyExistsError, FailedPreconditionError, InvalidArgumentError } from '@sandnode/shared';
import { buildTemplate, initScript, listTemplates, MANIFEST_FILE, readTemplate, sharedLibraries } from './template-builder';

const BUSYBOX = '/bin/busybox';

describe('template builder', () => {
  let dir: string;
  let bundle: string;
  beforeAll(() => {
    dir = mkdtempSync(path.join(tmpdir(), 'tpl-unit-'));
    bundle = path.join(dir, 'podd.bundle.js');
    writeFileSync(bundle, '#!/usr/bin/env node\nconsole.log("fake podd")\n');
  });
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  test('bad names are INVALID_ARGUMENT naming name', async () => {
    for (const name of ['', 'Upper', '-lead', 'a/b', '.hidden', 'x'.repeat(64), '../up']) {
      await expect(buildTemplate({ name, templatesDir: dir, poddBundlePath: bundle, poddVersion: '1.0.0' })).rejects.toThrow(InvalidArgumentError);
      await expect(buildTemplate({ name, templatesDir: dir, poddBundlePath: bundle, poddVersion: '1.0.0' })).rejects.toThrow(/^name/);
    }
    await expect(readTemplate(dir, 'Bad')).rejects.toThrow(/^name/);
  });

  test('missing parts are FAILED_PRECONDITION naming the part and how to get it', async () => {
    const base = { name: 'x', templatesDir: path.join(dir, 'tpl-missing'), poddVersion: '1.0.0' };
    await expect(buildTemplate({ ...base, poddBundlePath: bundle, busyboxPath: path.join(dir, 'no-busybox') })).rejects.toThrow(FailedPreconditionError);
    await expect(buildTemplate({ ...base, poddBundlePath: bundle, busyboxPath: path.join(dir, 'no-busybox') })).rejects.toThrow(/busybox.*apt-get install busybox-static/);
    await expect(buildTemplate({ ...base, poddBundlePath: bundle, busyboxPath: process.execPath })).rejects.toThrow(/dynamically linked.*busybox-static/);
    await expect(buildTemplate({ ...base, poddBundlePath: path.join(dir, 'nope.js') })).rejects.toThrow(/podd bundle.*npm run build/);
    expect(existsSync(path.join(dir, 'tpl-missing', 'x'))).toBe(false);
  });

  (existsSync(BUSYBOX) ? test : test.skip)('a template Node that is missing or older than 22 is FAILED_PRECONDITION naming templateNode', async () => {
    const base = { name: 'x', templatesDir: path.join(dir, 'tpl-old-node'), poddVersion: '1.0.0', poddBundlePath: bundle, busyboxPath: BUSYBOX };
    const old = path.join(dir, 'node20');
    writeFileSync(old, '#!/bin/sh\necho v20.20.2\n', { mode: 0o755 });
    await expect(buildTemplate({ ...base, nodePath: old })).rejects.toThrow(FailedPreconditionError);
    await expect(buildTemplate({ ...base, nodePath: old })).rejects.toThrow(/is v20\.20\.2: templates need Node >= 22.*templateNode/);
    await expect(buildTemplate({ ...base, nodePath: path.join(dir, 'no-node') })).rejects.toThrow(/node binary not found.*templateNode/);
    expect(existsSync(path.join(dir, 'tpl-old-node', 'x'))).toBe(false);
  });

  test('ldd parsing: node has libc and the loader; a static binary has none', async () => {
    const libs = await sharedLibraries(process.execPath);
    expect(libs.some((l) => /libc\.so/.test(l))).toBe(true);
    expect(libs.some((l) => /ld-linux/.test(l))).toBe(true);
    expect(await sharedLibraries(BUSYBOX)).toEqual([]);
  });

  const haveBusybox = existsSync(BUSYBOX);
  (haveBusybox ? test : test.skip)('builds, lists, refuses a duplicate, replaces atomically', async () => {
    const templatesDir = path.join(dir, 'templates');
    const t = await buildTemplate({ name: 'base', templatesDir, poddBundlePath: bundle, poddVersion: '1.2.3' });
    expect(t).toMatchObject({ name: 'base', poddVersion: '1.2.3', rootfsPath: path.join(templatesDir, 'base', 'rootfs') });
    expect(t.sizeBytes).toBeGreaterThan(statSync(process.execPath).size);
    expect(t.buildMs).toBeGreaterThanOrEqual(0);
    const r = t.rootfsPath;
    expect(readlinkSync(path.join(r, 'bin/sh'))).toBe('busybox');
    expect(statSync(path.join(r, 'tmp')).mode & 0o7777).toBe(0o1777);
    expect(statSync(path.join(r, 'sbin/sandnode-init')).mode & 0o777).toBe(0o755);
    expect(readFileSync(path.join(r, 'sbin/sandnode-init'), 'utf8')).toBe(initScript());
    expect(readFileSync(path.join(r, 'opt/sandnode/podd.js'), 'utf8')).toContain('fake podd');
    for (const d of ['proc', 'sys', 'dev', 'workspace', 'run/sandnode', 'root', 'var/tmp']) expect(lstatSync(path.join(r, d)).isDirectory()).toBe(true);
    for (const f of ['passwd', 'group', 'hosts', 'nsswitch.conf']) expect(lstatSync(path.join(r, 'etc', f)).isFile()).toBe(true);
    for (const lib of await sharedLibraries(process.execPath)) expect(existsSync(path.join(r, lib))).toBe(true);
    expect(JSON.parse(readFileSync(path.join(templatesDir, 'base', MANIFEST_FILE), 'utf8'))).toMatchObject({ format: 1, name: 'base', poddVersion: '1.2.3' });

    expect(await readTemplate(templatesDir, 'base')).toEqual(t);
    expect(await readTemplate(templatesDir, 'other')).toBeUndefined();
    await expect(buildTemplate({ name: 'base', templatesDir, poddBundlePath: bundle, poddVersion: '1.2.3' })).rejects.toThrow(AlreadyExistsError);

    writeFileSync(path.join(r, 'marker'), 'old');
    const t2 = await buildTemplate({ name: 'base', templatesDir, poddBundlePath: bundle, poddVersion: '2.0.0', replace: true });
    expect(t2.poddVersion).toBe('2.0.0');
    expect(existsSync(path.join(r, 'marker'))).toBe(false);
    expect(readdirSync(path.join(templatesDir, 'base')).sort()).toEqual([MANIFEST_FILE, 'rootfs']); // no temp or old trees left

    mkdirSync(path.join(templatesDir, 'junk'));
    mkdirSync(path.join(templatesDir, 'Not-A-Name'));
    expect((await listTemplates(templatesDir)).map((x) => [x.name, x.poddVersion])).toEqual([['base', '2.0.0']]);
    expect(await listTemplates(path.join(dir, 'none'))).toEqual([]);
  });
});
