import { ConfigError } from '@sandnode/shared';
import { parseArgs, UsageError } from './main';
import { configSchema, DEFAULT_PEER_CALL_TIMEOUT_MS, DEFAULT_PEER_RETRY_ATTEMPTS, DEFAULT_PODD_CALL_TIMEOUT_MS, DEFAULT_PODD_RETRY_ATTEMPTS, loadServerConfig } from './config';
import { setServerFailpoints } from './handover/failpoints';

describe('server command line', () => {
  it('accepts --config FILE, --config=FILE and --help', () => {
    expect(parseArgs([])).toEqual({ help: false });
    expect(parseArgs(['--config', '/etc/s.json'])).toEqual({ config: '/etc/s.json', help: false });
    expect(parseArgs(['--config=/etc/s.json'])).toEqual({ config: '/etc/s.json', help: false });
    expect(parseArgs(['--help'])).toEqual({ help: true });
  });

  it('--config without a value is a usage error naming it', () => {
    for (const argv of [['--config'], ['--config='], ['--config', '--help']]) {
      expect(() => parseArgs(argv)).toThrow(UsageError);
      expect(() => parseArgs(argv)).toThrow('--config needs a value');
    }
  });

  it('an unknown argument is a usage error naming it', () => {
    expect(() => parseArgs(['--conifg', 'x'])).toThrow(new UsageError('unknown argument "--conifg" (usage: sandnode-server [--config FILE])'));
    expect(() => parseArgs(['--config', 'a.json', 'extra'])).toThrow('unknown argument "extra"');
  });
});

describe('server config', () => {
  it('has the named defaults for peer deadlines and retries', () => {
    const c = loadServerConfig({ env: {} });
    expect(c).toMatchObject({
      peerCallTimeoutMs: DEFAULT_PEER_CALL_TIMEOUT_MS,
      peerRetryAttempts: DEFAULT_PEER_RETRY_ATTEMPTS,
      poddCallTimeoutMs: DEFAULT_PODD_CALL_TIMEOUT_MS,
      poddRetryAttempts: DEFAULT_PODD_RETRY_ATTEMPTS,
      takeover: false,
    });
    expect(Object.keys(configSchema.shape)).toContain('peerStartTimeoutMs');
  });

  it('env overrides, and a bad value names the key', () => {
    expect(loadServerConfig({ env: { SANDNODE_SERVER_PEER_CALL_TIMEOUT_MS: '1500', SANDNODE_SERVER_TAKEOVER: 'yes' } })).toMatchObject({ peerCallTimeoutMs: 1500, takeover: true });
    expect(() => loadServerConfig({ env: { SANDNODE_SERVER_TAKEOVER: 'ture' } })).toThrow(/key "takeover" \(env SANDNODE_SERVER_TAKEOVER\)/);
    expect(() => loadServerConfig({ env: { SANDNODE_SERVER_PODD_RETRY_ATTEMPTS: '-1' } })).toThrow(/key "poddRetryAttempts"/);
  });
});

describe('server failpoints', () => {
  afterEach(() => setServerFailpoints(''));

  it('read SANDNODE_SERVER_FAILPOINTS; an unknown name fails naming it', () => {
    expect(setServerFailpoints('handover.after-hold=kill,fork.after-clone=error')).toEqual(['handover.after-hold=kill', 'fork.after-clone=error']);
    expect(() => setServerFailpoints('handover.after-nothing=kill')).toThrow(ConfigError);
    expect(() => setServerFailpoints('handover.after-nothing=kill')).toThrow(/SANDNODE_SERVER_FAILPOINTS: unknown failpoint "handover.after-nothing"/);
    expect(() => setServerFailpoints('handover.after-hold=explode')).toThrow(/unknown action "explode"/);
  });
});
