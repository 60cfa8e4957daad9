"""The guards every command passes on its way in and out: its own small files read bounded
and only when regular (:mod:`.bounded_json`, :mod:`.folders`), output folders claimed,
locked and written atomically (:mod:`.outputs`), text quoted for where it is shown
(:mod:`.quoting`), sizes and work bounded before they allocate (:mod:`.memory_check`,
:mod:`.work_limit`), and a missing optional extra named in one line (:mod:`.extras`)."""
