import { Failpoints, failpointsEnv } from './failpoints';

describe('Failpoints', () => {
  const fp = new Failpoints({ service: 'ublk-manager', names: ['a.one', 'a.two'] as const, pausable: ['a.two'] });

  it('uses one env var per service', () => {
    expect(failpointsEnv('ublk-manager')).toBe('SANDNODE_UBLK_MANAGER_FAILPOINTS');
    expect(failpointsEnv('server')).toBe('SANDNODE_SERVER_FAILPOINTS');
    expect(fp.env).toBe('SANDNODE_UBLK_MANAGER_FAILPOINTS');
  });

  it('parses name=action lists and bare names as the default action', () => {
    expect([...fp.parse(' a.one=error , a.two ')]).toEqual([
      ['a.one', 'error'],
      ['a.two', 'kill'],
    ]);
  });

  it('rejects unknown names and actions, naming them and the env var', () => {
    expect(() => fp.parse('a.three=kill')).toThrow(/SANDNODE_UBLK_MANAGER_FAILPOINTS: unknown failpoint "a.three"/);
    expect(() => fp.parse('a.one=explode')).toThrow(/unknown action "explode"/);
    expect(() => fp.parse('a.one=pause')).toThrow(/pause is only for a.two/);
    expect(() => fp.parse('a.one=hang')).toThrow(/hang is only for none/);
  });

  it('an error failpoint throws at its place, off does nothing', () => {
    fp.set('a.one=error,a.two=off');
    expect(() => fp.hit('a.one')).toThrow('failpoint a.one');
    expect(() => fp.hit('a.two')).not.toThrow();
    expect(fp.list()).toEqual(['a.one=error']);
    expect(fp.enabled('a.two')).toBe(false);
    fp.set('');
    expect(() => fp.hit('a.one')).not.toThrow();
  });
});
