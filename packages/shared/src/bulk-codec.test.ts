import { BinaryWriter } from '@bufbuild/protobuf/wire';
import { decodeDownload, decodeUploadData, encodeDownload, encodeUploadData } from './bulk-codec';
import { DownloadFileResponse, UploadFileRequest } from './gen/sandnode/server/v1/files';

// The fast codec must give the generated codec's bytes, and read what it writes (and leave
// every other message to it).
describe('bulk codec of the file streams', () => {
  const data = Buffer.from(Array.from({ length: 70_000 }, (_, i) => i % 251));
  /** generated is the ts-proto encoding, through a writer (the fast path is skipped with one). */
  const genDownload = (m: DownloadFileResponse) => Buffer.from(DownloadFileResponse.encode(m, new BinaryWriter()).finish());
  const genUpload = (m: UploadFileRequest) => Buffer.from(UploadFileRequest.encode(m, new BinaryWriter()).finish());

  test.each([
    { data, offset: 0, sizeBytes: 0 },
    { data, offset: 2 ** 40 + 3, sizeBytes: 0 },
    { data: Buffer.alloc(0), offset: 5, sizeBytes: 2 ** 52 },
    { data: Buffer.alloc(0), offset: 0, sizeBytes: 0 },
  ])('DownloadFileResponse %#: same bytes as generated, decodes back', (m) => {
    const msg = { ...m, _unknownFields: {} };
    const fast = encodeDownload(msg);
    expect(fast.equals(genDownload(msg))).toBe(true);
    expect(Buffer.from(DownloadFileResponse.encode(msg).finish()).equals(fast)).toBe(true);
    const back = decodeDownload(fast);
    expect(back?.offset).toBe(m.offset);
    expect(back?.sizeBytes).toBe(m.sizeBytes);
    expect(Buffer.compare(back?.data ?? Buffer.alloc(1), m.data)).toBe(0);
    expect(DownloadFileResponse.decode(fast)).toEqual(DownloadFileResponse.decode(genDownload(msg)));
  });

  test('UploadFileRequest data: same bytes as generated; header and end go to the generated codec', () => {
    for (const d of [data, Buffer.alloc(0)]) {
      const msg: UploadFileRequest = { part: { $case: 'data', value: d }, _unknownFields: {} };
      const fast = encodeUploadData(d);
      expect(fast.equals(genUpload(msg))).toBe(true);
      expect(Buffer.compare(decodeUploadData(fast) ?? Buffer.alloc(1), d)).toBe(0);
      expect(UploadFileRequest.decode(fast)).toEqual(msg);
    }
    const header: UploadFileRequest = { part: { $case: 'header', value: { sandboxId: 'sb-1', path: 'f', offset: 3, mode: 0o644, inPlace: true, _unknownFields: {} } }, _unknownFields: {} };
    const hb = Buffer.from(UploadFileRequest.encode(header).finish());
    expect(hb.equals(genUpload(header))).toBe(true);
    expect(decodeUploadData(hb)).toBeUndefined();
    expect(UploadFileRequest.decode(hb).part).toEqual(header.part);
  });

  test('a data field longer than the message, or trailing bytes, is left to the generated codec', () => {
    const cut = encodeUploadData(data).subarray(0, 100);
    expect(decodeUploadData(cut)).toBeUndefined();
    expect(() => UploadFileRequest.decode(cut)).toThrow();
    expect(decodeDownload(Buffer.concat([encodeDownload({ data, offset: 1, sizeBytes: 0 }), Buffer.from([0x28, 1])]))).toBeUndefined();
  });
});
