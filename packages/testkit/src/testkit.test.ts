import { existsSync, rmSync } from 'node:fs';
import { ClientError, Status } from 'nice-grpc-common';
import { expectCode } from './expect-code';
import { inCi, missing, type Part } from './prereq';
import { makeTempDir, useTempDir } from './temp-dir';
import { waitFor } from './wait-for';

describe('prerequisites', () => {
  const here: Part = { name: 'here', present: () => true, ciProvides: true };
  const gone: Part = { name: 'gone (apt-get install gone)', present: () => false, ciProvides: true };
  it('names what is missing', () => {
    expect(missing([here, gone])).toEqual(['gone (apt-get install gone)']);
  });
  it('reads CI=true and CI=1 as CI', () => {
    expect(inCi({ CI: 'true' })).toBe(true);
    expect(inCi({ CI: '1' })).toBe(true);
    expect(inCi({})).toBe(false);
    expect(inCi({ CI: 'false' })).toBe(false);
  });
});

describe('expectCode', () => {
  it('returns the ClientError of the expected code', async () => {
    const e = await expectCode(Promise.reject(new ClientError('/x', Status.NOT_FOUND, 'no sandbox sb-1')), Status.NOT_FOUND, /sb-1/);
    expect(e.code).toBe(Status.NOT_FOUND);
  });
  it('fails on success, on another code and on other details', async () => {
    await expect(expectCode(Promise.resolve(1), Status.NOT_FOUND)).rejects.toThrow('expected NOT_FOUND, got success');
    await expect(expectCode(Promise.reject(new ClientError('/x', Status.ABORTED, 'stale')), Status.NOT_FOUND)).rejects.toThrow('got ABORTED');
    await expect(expectCode(Promise.reject(new ClientError('/x', Status.NOT_FOUND, 'a')), Status.NOT_FOUND, 'b')).rejects.toThrow('do not match');
  });
});

describe('waitFor', () => {
  it('returns the first truthy value', async () => {
    let n = 0;
    await expect(waitFor('n to reach 3', () => ++n >= 3 && n, 1000, 1)).resolves.toBe(3);
  });
  it('times out naming what it waited for and the last error', async () => {
    await expect(
      waitFor(
        'never',
        () => {
          throw new Error('boom');
        },
        30,
        5,
      ),
    ).rejects.toThrow(/timed out after 30 ms waiting for never: last error: boom/);
  });
});

describe('useTempDir', () => {
  const dir = useTempDir('testkit');
  let seen = '';
  it('gives each test a fresh dir', () => {
    seen = dir();
    expect(existsSync(seen)).toBe(true);
  });
  it('removed the previous test dir', () => {
    expect(existsSync(seen)).toBe(false);
    expect(dir()).not.toBe(seen);
    const made = makeTempDir('x');
    expect(made).toMatch(/sandnode-x-/);
    expect(existsSync(made)).toBe(true);
    rmSync(made, { recursive: true });
  });
});
