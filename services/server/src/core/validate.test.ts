import { InvalidArgumentError } from '@sandnode/shared';
import {
  MAX_EXEC_ARGS_BYTES,
  MAX_EXEC_STRING_BYTES,
  MAX_NAME_BYTES,
  MAX_PATH_BYTES,
  validateArgv,
  validateCwd,
  validateMetadata,
  validateResources,
  validateTimeoutSeconds,
  workspacePath,
} from './validate';

const d = { vcpus: 1, memoryMib: 512, diskBytes: 1 << 30 };

describe('workspacePath', () => {
  it.each([
    ['a.txt', '/workspace/a.txt'],
    ['dir/b', '/workspace/dir/b'],
    ['/workspace/x', '/workspace/x'],
    ['./y', '/workspace/y'],
  ])('%s -> %s', (p, want) => expect(workspacePath('path', p)).toBe(want));

  it.each(['', '..', '../etc/passwd', 'a/../../b', '/workspace/../etc', '/etc/passwd', '/workspacex/a', '/workspace', 'a\0b'])('refuses %j', (p) => {
    expect(() => workspacePath('path', p)).toThrow(InvalidArgumentError);
    expect(() => workspacePath('path', p)).toThrow(/^path/);
  });
});

describe('validateResources', () => {
  it('fills defaults (pids 0 stays 0: the supervisor applies its own)', () => expect(validateResources('resources', undefined, d)).toEqual({ ...d, pids: 0 }));
  it('keeps given values', () => expect(validateResources('r', { vcpus: 2, memoryMib: 64, diskBytes: 32 << 20, pids: 16 }, d)).toEqual({ vcpus: 2, memoryMib: 64, diskBytes: 32 << 20, pids: 16 }));
  it.each([
    [{ vcpus: 65 }, /r\.vcpus/],
    [{ vcpus: -1 }, /r\.vcpus/],
    [{ memoryMib: 16 }, /r\.memory_mib/],
    [{ diskBytes: 1000 }, /r\.disk_bytes/],
    [{ diskBytes: (16 << 20) + 1 }, /r\.disk_bytes/],
    [{ pids: 15 }, /r\.pids/],
    [{ pids: 1_000_001 }, /r\.pids/],
    [{ pids: 1.5 }, /r\.pids/],
  ])('refuses %j', (r, msg) => expect(() => validateResources('r', r, d)).toThrow(msg));
});

describe('other rules', () => {
  it('timeout range', () => {
    expect(validateTimeoutSeconds('t', 0)).toBe(0);
    expect(() => validateTimeoutSeconds('t', -1)).toThrow(/^t:/);
    expect(() => validateTimeoutSeconds('t', 30 * 24 * 3600 + 1)).toThrow(/^t:/);
  });
  it('argv', () => {
    expect(() => validateArgv('argv', [])).toThrow(/argv/);
    expect(() => validateArgv('argv', [''])).toThrow(/argv\[0\]/);
    expect(validateArgv('argv', ['ls', '-l'])).toEqual(['ls', '-l']);
  });
  it('argv and env sizes: one entry at most 128 KiB - 1, all together at most 1 MiB', () => {
    const big = 'x'.repeat(200 * 1024);
    expect(() => validateArgv('argv', ['echo', big])).toThrow(new InvalidArgumentError(`argv[1]: ${200 * 1024} bytes, at most ${MAX_EXEC_STRING_BYTES} per argument`));
    expect(() => validateArgv('argv', ['true'], { BIG: big })).toThrow(/^env\[BIG\]: 204804 bytes as KEY=VALUE, at most 131071 per variable$/);
    const many = Array.from({ length: 9 }, () => 'y'.repeat(MAX_EXEC_STRING_BYTES));
    expect(() => validateArgv('argv', ['true', ...many])).toThrow(new RegExp(`^argv \\+ env: \\d+ bytes, at most ${MAX_EXEC_ARGS_BYTES} together$`));
    expect(() => validateArgv('argv', ['true', ...many.slice(0, 4)], { A: 'y'.repeat(MAX_EXEC_STRING_BYTES - 2) })).not.toThrow();
  });
  it('argv[0]: a name at most NAME_MAX (255) bytes, a path at most PATH_MAX - 1 (4095): longer ones the kernel refuses (ENAMETOOLONG)', () => {
    expect(validateArgv('argv', ['x'.repeat(MAX_NAME_BYTES)])).toHaveLength(1);
    expect(() => validateArgv('argv', ['x'.repeat(256)])).toThrow(/^argv\[0\]: "x+"\.\.\. \(256 bytes\) has a 256-byte name, at most 255 per name \(NAME_MAX\)$/);
    expect(() => validateArgv('argv', [`/bin/${'y'.repeat(300)}/sh`])).toThrow(/^argv\[0\]: .* has a 300-byte name/);
    const long = '/a'.repeat(2500);
    expect(() => validateArgv('argv', [long])).toThrow(/^argv\[0\]: "(\/a)+"\.\.\. \(5000 bytes\) 5000 bytes, at most 4095 \(PATH_MAX\)$/);
    expect(validateArgv('argv', [`/${'a/'.repeat((MAX_PATH_BYTES - 2) / 2)}b`])).toHaveLength(1);
    // only argv[0] is a path: the arguments keep their own limit
    expect(validateArgv('argv', ['echo', 'z'.repeat(10_000)])).toHaveLength(2);
  });
  it('cwd: empty (the default) or at most PATH_MAX - 1 bytes with names of at most NAME_MAX; the message quotes only a prefix', () => {
    expect(validateCwd('cwd', '')).toBe('');
    expect(validateCwd('cwd', '/workspace/src')).toBe('/workspace/src');
    const huge = `/${'d'.repeat(100 * 1024)}`;
    expect(() => validateCwd('cwd', huge)).toThrow(InvalidArgumentError);
    expect(() => validateCwd('cwd', huge)).toThrow(/^cwd: .* 102401 bytes, at most 4095 \(PATH_MAX\)$/);
    const msg = (() => {
      try {
        validateCwd('cwd', huge);
      } catch (e) {
        return (e as Error).message;
      }
      return '';
    })();
    expect(Buffer.byteLength(msg)).toBeLessThan(200);
    expect(() => validateCwd('cwd', `/workspace/${'n'.repeat(256)}`)).toThrow(/^cwd: .* has a 256-byte name/);
    expect(() => validateCwd('cwd', '/work\0space')).toThrow(/^cwd: contains a NUL byte$/);
  });
  it('metadata', () => {
    expect(() => validateMetadata('metadata', { 'a b': 'x' })).toThrow(/metadata/);
    expect(() => validateMetadata('metadata', { a: 'x'.repeat(257) })).toThrow(/256 bytes/);
    expect(validateMetadata('metadata', { 'app.io/name': 'x' })).toEqual({ 'app.io/name': 'x' });
  });
});
