from satseq.data.cursor import PromptCursor


def test_cursor_covers_each_epoch_once_and_resumes_exactly():
    cursor = PromptCursor(size=5, seed=3)
    first_epoch = cursor.next(3) + cursor.next(2)
    assert sorted(first_epoch) == [0, 1, 2, 3, 4]
    crossing = cursor.next(7)  # epoch 1 in full, then 2 of epoch 2
    assert sorted(crossing[:5]) == [0, 1, 2, 3, 4]
    assert crossing[:5] != first_epoch  # a new shuffle each epoch
    resumed = PromptCursor(size=5, seed=3)
    resumed.load_state_dict(cursor.state_dict())
    assert resumed.next(4) == cursor.next(4)
