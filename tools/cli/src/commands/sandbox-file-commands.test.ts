import { rateText } from './sandbox-file-commands';

describe('rateText', () => {
  it('says the rate of a copy that sent 1 MB or more and nothing for a small one (no "0 MB/s")', () => {
    expect(rateText({ bytesSent: 4096, mbPerSec: 0 })).toBe('');
    expect(rateText({ bytesSent: 999_999, mbPerSec: 0.3 })).toBe('');
    expect(rateText({ bytesSent: 1_000_000, mbPerSec: 12.5 })).toBe(', 12.5 MB/s');
  });
});
