import { InternalError } from '@sandnode/shared';
import { activeFailpoints, failpoint, parseFailpoints, setFailpoints } from './failpoints';

describe('failpoints', () => {
  afterEach(() => setFailpoints(undefined));
  it('parses name=action lists and refuses unknown names or actions', () => {
    expect([...parseFailpoints('ublk.recover=error, ublk.release.after=kill')]).toEqual([
      ['ublk.recover', 'error'],
      ['ublk.release.after', 'kill'],
    ]);
    expect(() => parseFailpoints('ublk.nope=error')).toThrow(/unknown failpoint "ublk.nope"/);
    expect(() => parseFailpoints('ublk.recover=explode')).toThrow(/unknown action "explode"/);
  });
  it('error throws InternalError naming the failpoint; unset and off do nothing', () => {
    expect(() => failpoint('ublk.recover')).not.toThrow();
    setFailpoints('ublk.recover=error,ublk.quiesce.after=off');
    expect(activeFailpoints()).toEqual(['ublk.recover=error']);
    expect(() => failpoint('ublk.recover')).toThrow(new InternalError('failpoint ublk.recover'));
    expect(() => failpoint('ublk.quiesce.after')).not.toThrow();
  });
});
