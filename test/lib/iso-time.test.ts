import { suite } from 'uvu';
import * as assert from 'uvu/assert';
import { isoTimeMs } from '../../lib/iso-time.js';

const iso = suite('ISO 8601 text read strictly (lib/iso-time.ts)');

iso('a date-time with its offset reads as Date.parse reads it, fractions and offsets without a colon included', () => {
  for (const text of ['2027-01-01T09:00:00Z', '2027-01-01T09:00Z', '2027-01-01t09:00:00.5z', '2027-01-01T09:00:00.123456789+02:00', '2027-01-01T09:00:00-0530', '2024-02-29T23:59:59.999Z']) {
    assert.is(isoTimeMs(text), Date.parse(text.replace(/([+-]\d{2})(\d{2})$/, '$1:$2').replace(/\.(\d{3})\d+/, '.$1')), text);
  }
});

iso('years 0000–0099 are those years, and a fraction longer than nine digits is read to the millisecond (probe ET: both were no date-time, and compared as text)', () => {
  assert.is(isoTimeMs('0050-01-01T00:00:00Z'), Date.parse('0050-01-01T00:00:00Z'));
  assert.is(isoTimeMs('0000-01-01T00:00:00Z'), Date.parse('0000-01-01T00:00:00Z'));
  assert.is(isoTimeMs('0050-01-01', { date: true }), Date.parse('0050-01-01T00:00:00Z'));
  assert.is(isoTimeMs('0050-02-29T00:00:00Z'), null, 'year 50 was no leap year');
  assert.is(isoTimeMs('2025-01-01T01:00:00.0000000001+02:00'), Date.parse('2024-12-31T23:00:00Z'));
  assert.is(isoTimeMs('2025-01-01T00:00:00.123456789012Z'), Date.parse('2025-01-01T00:00:00.123Z'));
});

iso('a date alone is its midnight UTC where the caller allows it, and nothing elsewhere', () => {
  assert.is(isoTimeMs('2027-01-01', { date: true }), Date.UTC(2027, 0, 1));
  assert.is(isoTimeMs('2027-01-01'), null);
});

iso('a time without an offset, lenient forms Date.parse takes, and days or times that do not exist are null', () => {
  for (const text of ['2027-01-01T10:00', '2027-01-01T10:00:00', '2027-01-01 10:00Z', '2027-01-01 (note)', '2027-06-01 10:00 PST', 'tomorrow', '',
    '2030-02-30T00:00:00Z', '2031-13-01T00:00:00Z', '2027-01-01T24:00Z', '2027-01-01T10:60Z', '2027-01-01T10:00:60Z', '2027-01-01T10:00+24:00', '27-01-01T10:00Z']) {
    assert.is(isoTimeMs(text, { date: true }), null, text);
  }
});

iso.run();
