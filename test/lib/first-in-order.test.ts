import { test } from 'uvu';
import * as assert from 'uvu/assert';
import { firstInOrder } from '../../lib/first-in-order.js';

const byNumber = (a: number, b: number) => a - b;

test('firstInOrder: the first count items as a full sort gives them, for random, sorted, reversed and tied input', () => {
  let seed = 7;
  const random = () => (seed = (seed * 48_271) % 2_147_483_647) % 1_000;
  const inputs = [
    Array.from({ length: 5_000 }, random),
    Array.from({ length: 5_000 }, (_, i) => i),
    Array.from({ length: 5_000 }, (_, i) => 5_000 - i),
    Array.from({ length: 5_000 }, () => 3),
    [],
  ];
  for (const items of inputs) {
    for (const count of [0, 1, 2, 51, 4_999, 5_000, 6_000]) {
      assert.equal(firstInOrder(items, count, byNumber), [...items].sort(byNumber).slice(0, Math.max(0, count)), `${items.length} items, count ${count}`);
    }
  }
});

test('firstInOrder: stable among equals (the earlier item first), like Array.prototype.sort', () => {
  const items = [{ k: 1, i: 0 }, { k: 0, i: 1 }, { k: 1, i: 2 }, { k: 0, i: 3 }, { k: 1, i: 4 }];
  const compare = (a: { k: number }, b: { k: number }) => a.k - b.k;
  assert.equal(firstInOrder(items, 4, compare).map((x) => x.i), [1, 3, 0, 2]);
});

test.run();
