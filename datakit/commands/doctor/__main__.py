"""`python -m datakit.commands.doctor SRC ...`: the doctor command without the rest of the datakit CLI."""
import sys

from datakit.commands.doctor.command import main

sys.exit(main())
