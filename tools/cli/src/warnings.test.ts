import { quietIpServername } from './warnings';

describe('quietIpServername', () => {
  const original = process.emitWarning;
  afterEach(() => {
    process.emitWarning = original;
  });

  it('drops DEP0123 in every calling form and passes other warnings on, with their arguments', () => {
    const inner = jest.fn();
    process.emitWarning = inner as unknown as typeof process.emitWarning;
    quietIpServername();
    quietIpServername();
    process.emitWarning('Setting the TLS ServerName to an IP address is not permitted by RFC 6066.', 'DeprecationWarning', 'DEP0123');
    process.emitWarning('ip servername', { type: 'DeprecationWarning', code: 'DEP0123' });
    process.emitWarning(Object.assign(new Error('as an Error'), { code: 'DEP0123' }));
    process.emitWarning('another one', 'DeprecationWarning', 'DEP0005');
    process.emitWarning('plain');
    expect(inner.mock.calls).toEqual([['another one', 'DeprecationWarning', 'DEP0005'], ['plain']]);
  });

  it('without it DEP0123 goes through (what the CLI printed before)', () => {
    const inner = jest.fn();
    process.emitWarning = inner as unknown as typeof process.emitWarning;
    process.emitWarning('x', 'DeprecationWarning', 'DEP0123');
    expect(inner).toHaveBeenCalledTimes(1);
  });
});
