import { parseDaemonArgs, UsageError } from './daemon-args';

const USAGE = 'usage: d [--config FILE] [--socket PATH]';

describe('parseDaemonArgs', () => {
  it('reads --config, --help and the daemon flags, also as --flag=value', () => {
    expect(parseDaemonArgs(['--config', 'a.json', '--socket=/s', '-h'], USAGE, ['socket'])).toEqual({ config: 'a.json', help: true, values: { socket: '/s' } });
    expect(parseDaemonArgs([], USAGE)).toEqual({ help: false, values: {} });
  });
  it.each([
    [['--config'], '--config needs a value (usage: d [--config FILE] [--socket PATH])'],
    [['--config='], '--config needs a value'],
    [['--config', '--socket', '/s'], '--config needs a value (got "--socket")'],
    [['--bogus'], 'unknown argument "--bogus"'],
    [['stray'], 'unknown argument "stray"'],
    [['--socket', '/s'], 'unknown argument "--socket"'],
  ])('%j is a usage error: %s', (argv, msg) => {
    expect(() => parseDaemonArgs(argv, USAGE)).toThrow(UsageError);
    expect(() => parseDaemonArgs(argv, USAGE)).toThrow(msg);
  });
});
